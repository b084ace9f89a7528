"""docs/results/gpu: the tables are what `scripts/gpu_check.py --table` makes of the committed json
files, each json's derived figures follow from its raw ones, and the prose quotes them as measured;
docs/performance.md's memory table is what `scripts/memory_analysis.py --table` makes of its json."""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import pytest
from conftest import ROOT, load_script

FOLDER = os.path.join(ROOT, "docs", "results", "gpu")
MARKER = "<!-- generated: scripts/gpu_check.py --table -->\n"


def _results() -> dict[str, dict]:
  out = {}
  for path in sorted(glob.glob(os.path.join(FOLDER, "gpu-check-*.json"))):
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
  argv = ["--cpu_smoke", "--sides=gpt2,step:schedule", f"--json={path}"]  # tiny,micro, 2 rounds of 2 steps
  out = script.main(argv)
  assert out["command"] == "python scripts/gpu_check.py " + " ".join(argv)
  assert (out["preset"], out["rounds"], out["steps"]) == ("tiny,micro", 2, 2)
  # Both paths by default: today's (the einsum, the whole-logits loss) and the new one.
  assert set(out["sides"]) == {"gpt2", "step:schedule", "gpt2@new", "step:schedule@new"}
  assert out["sides"]["gpt2"]["ratio"] == 1.0
  assert (out["sides"]["gpt2"]["attention"], out["sides"]["gpt2"]["loss_chunk"]) == ("einsum", 0)
  assert (out["sides"]["gpt2@new"]["attention"], out["sides"]["gpt2@new"]["loss_chunk"]) == ("einsum", 128)  # CPU
  new = out["sides"]["gpt2@new"]
  assert new["speedup"] == out["sides"]["gpt2"]["median_ms"] / new["median_ms"]
  assert new["tokens_per_s"] == 4 * 32 / (new["median_ms"] / 1e3)  # tiny,micro: batch 4 x 32
  assert out["peak_flops"] is None and new["peak_share"] is None  # a CPU has no entry in the peak table
  assert out["growth_bytes"] == 0  # donation: the live bytes are the same after every round
  with open(path) as f:
    table = script.markdown([json.load(f)])
  assert table.startswith("**tiny,micro, batch the preset's") and "| gpt2@new |" in table and "tokens / s" in table


def test_on_a_cpu_the_script_refuses_at_once_naming_the_smoke_flag(capsys):
  """On a CPU backend (the tests' own) the script stops before it builds anything, naming `--cpu_smoke`;
  `--table` reads saved runs on any backend."""
  import jax

  script = load_script("gpu_check")
  assert jax.default_backend() == "cpu"
  with pytest.raises(SystemExit, match=r"JAX's backend here is the CPU.*python scripts/gpu_check\.py --cpu_smoke"):
    script.main(["--sides=gpt2"])
  assert script.main(["--table", os.path.join(FOLDER, "gpu-check-124m.json")]) == {}
  assert "| gpt2 |" in capsys.readouterr().out


def test_the_model_flops_a_token_and_the_peak_table():
  """GPT-2 Small's step: 6 x (12 layers' 12 d^2 matmul weights + the tied head once) + 12 L T d, about
  0.85 GFLOP a token; the positions table and the biases do not count."""
  import jax
  import jax.numpy as jnp

  from hybridjax.models import gpt2

  script = load_script("gpu_check")
  cfg = gpt2.PRESETS["124m"]
  params = jax.eval_shape(gpt2.GPT2(cfg).init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  d, layers, t, v = cfg.d_model, cfg.n_layer, cfg.n_ctx, cfg.vocab_size
  want = 6 * (layers * 12 * d * d + v * d) + 12 * layers * t * d
  assert script.model_flops_per_token(params, layers, t, d) == want
  assert 0.85e9 < want < 0.86e9
  untied_model = gpt2.GPT2(dataclasses.replace(cfg, untied_head=True))
  untied = jax.eval_shape(untied_model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  assert script.model_flops_per_token(untied, layers, t, d) == want  # the head once, the lookup table not
  assert script.peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and script.peak_flops("NVIDIA H200") == 989e12
  assert script.peak_flops("NVIDIA H100 PCIe") == 756e12 and script.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
  assert script.peak_flops("cpu") is None


MEMORY = os.path.join(FOLDER, "memory-analysis-124m.json")


def test_the_memory_table_is_generated_from_its_json_and_the_chunked_loss_saves_the_logits():
  with open(MEMORY) as f:
    result = json.load(f)
  with open(os.path.join(ROOT, "docs", "performance.md")) as f:
    text = f.read()
  table = text.split("<!-- memory-table:start (generated by scripts/memory_analysis.py --table) -->\n")[1]
  assert table.split("<!-- memory-table:end -->")[0] == load_script("memory_analysis").markdown(result)
  variants = list(result["variants"].values())
  today = variants[0]
  assert (today["attention"], today["loss_chunk"]) == ("einsum", 0)
  assert result["logits_f32_bytes"] == result["batch"] * result["seq_len"] * result["vocab_size"] * 4
  for v in variants:
    assert v["temp_drop"] == today["temp_size"] - v["temp_size"]
    if v["loss_chunk"]:  # the target: at least the float32 logits' size
      assert v["temp_drop"] >= result["logits_f32_bytes"]
