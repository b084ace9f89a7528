"""docs/results/gpu: the tables are what `scripts/gpu_check.py --table` makes of the committed json
files, each json's derived figures follow from its raw ones, and the prose quotes them as measured."""

from __future__ import annotations

import glob
import json
import os

import pytest
from conftest import ROOT, load_script

FOLDER = os.path.join(ROOT, "docs", "results", "gpu")
MARKER = "<!-- generated: scripts/gpu_check.py --table -->\n"


def _results() -> dict[str, dict]:
  out = {}
  for path in sorted(glob.glob(os.path.join(FOLDER, "*.json"))):
    with open(path) as f:
      out[os.path.basename(path)] = json.load(f)
  return out


def test_the_tables_are_generated_from_the_json_files():
  results = _results()
  assert set(results) == {
    "gpu-check-124m.json",
    "gpu-check-124m-recipe-steps.json",
    "gpu-check-124m-before-one-trace.json",
  }
  with open(os.path.join(FOLDER, "README.md")) as f:
    text = f.read()
  assert text.count(MARKER) == 1
  assert text.split(MARKER)[1] == load_script("gpu_check").markdown(list(results.values()))


def test_each_ratio_and_the_growth_follow_from_the_raw_figures():
  for r in _results().values():
    base = r["sides"]["gpt2"]["median_ms"]
    for side in r["sides"].values():
      assert abs(side["ratio"] - side["median_ms"] / base) < 1e-12
    if "memory" in r:
      used = [m["bytes_in_use"] for m in r["memory"].values()]
      assert r["growth_bytes"] == used[-1] - used[0]


def test_the_prose_quotes_the_figures_as_measured():
  results = _results()
  with open(os.path.join(FOLDER, "README.md")) as f:
    prose = f.read().split(MARKER)[0]
  whole, steps = results["gpu-check-124m.json"], results["gpu-check-124m-recipe-steps.json"]
  at_32, at_16 = whole["sides"]["speedrun"]["ratio"], steps["sides"]["step:attn_scale"]["ratio"]
  assert f"{at_32:.2f}× at the preset's batch" in prose and f"{at_16:.2f}× at batch 16" in prose
  assert f"need {at_16:.2f}× to {at_32:.2f}× fewer steps" in prose
  hybrid = sorted(r["sides"]["hybrid"]["ratio"] for r in (whole, steps))
  assert f"{hybrid[0]:.2f}× to {hybrid[1]:.2f}× the baseline's" in prose
  assert steps["growth_bytes"] == 0 and "(growth 0 B)" in prose
  added = steps["sides"]["step:value_embeds"]["params"] - steps["sides"]["step:unet"]["params"]
  assert f"{added / 1e6:.0f}M more" in prose
  with open(os.path.join(ROOT, "README.md")) as f:
    assert f"costs {at_16:.2f}–{at_32:.2f}× the plain GPT-2's" in f.read()
  # The hybrid step's compile, before and after it compiled each transition once.
  flat = " ".join(prose.split())
  for r, phrase in (
    (whole, "its first step, compile included, takes {h:.1f} s against the plain GPT-2's {g:.1f} s ({x:.2f}×)"),
    (results["gpu-check-124m-before-one-trace.json"], "the first step took {h:.1f} s against {g:.1f} s ({x:.2f}×"),
  ):
    h, g = r["sides"]["hybrid"]["first_step_s"], r["sides"]["gpt2"]["first_step_s"]
    assert phrase.format(h=h, g=g, x=h / g) in flat


@pytest.mark.slow  # compiles a micro model's step
def test_the_script_writes_a_json_its_table_reads(tmp_path, capsys):
  script = load_script("gpu_check")
  path = str(tmp_path / "check.json")
  argv = ["--preset=tiny,micro", "--sides=gpt2,step:schedule", "--rounds=2", "--steps=2", f"--json={path}"]
  out = script.main(argv)
  assert out["command"] == "python scripts/gpu_check.py " + " ".join(argv)
  assert set(out["sides"]) == {"gpt2", "step:schedule"} and out["sides"]["gpt2"]["ratio"] == 1.0
  assert out["growth_bytes"] == 0  # donation: the live bytes are the same after every round
  with open(path) as f:
    assert script.markdown([json.load(f)]).startswith("**tiny,micro, batch the preset's")
