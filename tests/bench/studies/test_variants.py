"""The variants study: its pairs' configs, the LRs it reads from a recipe record, its figures, and a
whole study through the skeleton with a stub runner (nothing trains)."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys

import pytest
from conftest import ROOT, SpecRunner, load_script

from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import cells, protocol, speedrun, study, tuning
from hybridjax.bench.studies.variants import config as variants_config
from hybridjax.bench.studies.variants import report, run
from hybridjax.bench.studies.variants.sets import SETS, Pair


def _config(tmp_path, **fields):
  c = benchmark_cfg.get_config("quick")
  c.model.n_layer = 2  # the value residual needs a later layer
  c.benchmark.study = "variants"
  recipe = {"trick_list": 1, "step_runs": {}}  # the first trick list: shortcuts was embed_skips
  for k, name in enumerate(speedrun.TRICKS_V1):
    recipe["step_runs"][name] = {"lr": 0.001 * (k + 1), "beta": 0.99, "iterate": "raw" if k % 2 else "averaged"}
  path = tmp_path / "recipe-quick.json"
  path.write_text(json.dumps(recipe))
  c.benchmark.variants.lrs_from = str(path)
  c.benchmark.variants.update(fields)
  return c


def test_a_side_is_its_row_of_the_recipe_then_its_own_fields(tmp_path):
  c = _config(tmp_path)
  pair = Pair("p", "modern_arch", "x", {"model.embed_norm": True}, {"model.relu2": False})
  before, after = (variants_config.side_config(c, pair, side) for side in ("before", "after"))
  as_recipe = speedrun.apply_tricks(c, list(speedrun.TRICKS)[:4])  # through modern_arch
  assert before.optim.name == after.optim.name == "muon_groups" and as_recipe.model.relu2
  assert before.model.embed_norm and not as_recipe.model.embed_norm and before.model.relu2
  assert not after.model.relu2 and not after.model.untied_head  # a later row's trick is not applied


def test_each_row_takes_the_lr_of_its_step_by_name_else_by_place_else_the_last(tmp_path):
  _, rows = run.row_settings(_config(tmp_path))
  assert rows["muon"] == {"lr": 0.003, "beta": 0.99, "iterate": "averaged", "from": "muon"}
  assert rows["shortcuts"]["from"] == "embed_skips" and rows["shortcuts"]["lr"] == 0.006
  assert rows["attn_scale"]["from"] == "value_embeds" and rows["attn_scale"]["lr"] == 0.008


def test_bad_settings_are_refused_naming_the_field(tmp_path):
  with pytest.raises(ValueError, match=r"--config.benchmark.variants.set must be one of \['fixes'.*got 'nope'"):
    study.validate(_config(tmp_path, set="nope"))
  with pytest.raises(ValueError, match=r"--config.benchmark.variants.lrs_from=.* does not exist"):
    study.validate(_config(tmp_path, lrs_from=str(tmp_path / "missing.json")))
  c = _config(tmp_path)
  c.model.relu2 = False
  c.benchmark.recipe.keep = "model.relu2"  # as the command line's --config.model.relu2=False does
  with pytest.raises(ValueError, match=r"pair 'relu2': its two sides are the same config, so it would read"):
    study.validate(c)
  partial = tmp_path / "partial.json"
  partial.write_text(json.dumps({"trick_list": 2, "step_runs": {"schedule": {"lr": 1, "beta": 1, "iterate": "raw"}}}))
  with pytest.raises(ValueError, match=r"holds no step .* give the record of a whole recipe with --config.benchmark"):
    study.validate(_config(tmp_path, lrs_from=str(partial)))
  c = _config(tmp_path)
  c.model.n_layer = 1
  with pytest.raises(ValueError, match=r"(?s)pair 'value_residual', after is not a valid run: .*model.value_residual"):
    study.validate(c)


def _stub_result(spec):
  """A run's figures, made up from its spec: what the study reads of a run (lowest at LR 0.004)."""
  lr = spec["config"]["optim"]["learning_rate"]
  noise = int(hashlib.md5(json.dumps(spec, sort_keys=True).encode()).hexdigest(), 16) % 1000 * 1e-5
  loss = 3.0 + 0.01 * spec["config"]["seed"] + noise + math.log(lr / 0.004) ** 2
  return {
    "seed": spec["config"]["seed"],
    "final_raw": loss,
    "final_averaged": {str(b): loss - 0.01 * b for b in spec["betas"] or [spec["config"]["trainer"]["averaging_beta"]]},
    "final_averaged_per_batch": [loss - 0.01 + 0.001 * j for j in range(3)],
    "key": f"k{noise:.5f}",
    "curve": [{"step": spec["config"]["trainer"]["steps"], "eval_loss_raw": loss}],
  }


def test_the_study_runs_each_distinct_side_once_and_its_figures_recompute(tmp_path, monkeypatch):
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  result = study.run(c, str(tmp_path / "work"), command="variants command")
  pairs = SETS["fixes"].pairs
  distinct = {run._side_key(c, p, side) for p in pairs for side in ("before", "after")}
  assert len(runner.specs) == len(distinct) * len(c.benchmark.seeds)
  written = json.loads((tmp_path / "work" / "variants-fixes-quick.json").read_text())
  assert [p["name"] for p in written["pairs"]] == [p.name for p in pairs]
  _, rows = run.row_settings(c)
  assert {s["config"]["optim"]["learning_rate"] for s in runner.specs} == {rows[p.row]["lr"] for p in pairs}
  for p in written["pairs"]:
    assert p["settings"]["after"] == rows[p["row"]]
    sides = {k: {"settings": p["settings"][k], "runs": p["runs"][k]} for k in ("before", "after")}
    again = run.pair_figures(sides["before"], sides["after"])
    assert again["difference"] == p["difference"] and again["before"] == p["before"]
  assert (tmp_path / "work" / "variants-fixes-quick.md").read_text() == report.markdown(written) + "\n"
  assert result["invocations"][0]["runs_trained"] == runner.ran


def test_the_published_fixes_are_the_record_as_written_reshaped():
  """The record the study's first reader wrote, reshaped by scripts/reshape_variants.py: the
  published one, every run's numbers kept."""
  folder = os.path.join(ROOT, "docs", "results", "recipe")
  with open(os.path.join(folder, "variants-fixes-long.as-written.json")) as f:
    written = json.load(f)
  with open(os.path.join(folder, "variants-fixes-long.json")) as f:
    assert load_script("reshape_variants").reshape(written) == json.load(f)


def test_published_variants_recompute_from_their_runs():
  """Every published variants record: each pair's figures from its runs, and its markdown."""
  paths = sorted(glob.glob(os.path.join(ROOT, "docs", "results", "recipe", "variants-*-*.json")))
  paths = [p for p in paths if not p.endswith(".as-written.json")]
  assert paths
  for path in paths:
    with open(path) as f:
      result = json.load(f)
    for p in result["pairs"]:
      sides = {k: {"settings": p["settings"][k], "runs": p["runs"][k]} for k in ("before", "after")}
      again = run.pair_figures(sides["before"], sides["after"])
      assert again == {k: p[k] for k in ("seeds", "before", "after", "difference")}, p["name"]
      d = p["difference"]
      assert protocol.paired_difference(p["after"], p["before"], d["eval_se"], eval_windows=d["eval_windows"]) == d
    assert result["resolution"] == 2 * statistics.median(p["difference"]["se_total"] for p in result["pairs"])
    with open(path.replace(".json", ".md")) as f:
      assert f.read() == report.markdown(result) + "\n"


def test_leave_one_out_tunes_each_side_and_states_what_goes_with_a_trick(tmp_path, monkeypatch):
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path, set="leave_one_out")
  c.model.n_layer = 4  # the U-net pairs layers
  c.benchmark.plateau_seeds = (4,)
  result = study.run(c, str(tmp_path / "work"))
  pairs = {p["name"]: p for p in result["pairs"]}
  assert list(pairs) == ["schedule", "rotary", "muon", "relu2", "qk_norm", "zero_init_proj"] + list(speedrun.TRICKS)[4:]
  _, rows = run.row_settings(c)
  full = pairs["unet"]["settings"]["after"]  # every pair's after side is the whole recipe, tuned once
  assert all(p["settings"]["after"] == full for p in pairs.values())
  assert set(tuning.lr_grid(rows["attn_scale"]["lr"], 3)) <= set(full["grid"])  # 3 points, extended at an edge
  assert set(tuning.lr_grid(rows["rotary"]["lr"], 3)) <= set(pairs["muon"]["settings"]["before"]["grid"])  # AdamW
  assert "AdamW" in pairs["muon"]["rule"] and "value residual" in pairs["value_embeds"]["rule"]
  sweeps = [s for s in runner.specs if s["config"]["seed"] in c.benchmark.tuning_seeds]
  assert {s["config"]["optim"]["name"] for s in sweeps} == {"adamw", "muon_groups"}
  no_embeds = [s for s in runner.specs if not s["config"]["model"]["value_embeds"]]
  assert no_embeds and all(s["config"]["model"]["value_residual"] for s in no_embeds)
  close = result["seeds_added"]["pairs"]
  assert close and result["seeds_added"]["seeds"] == [4]
  for name, p in pairs.items():
    assert p["seeds"] == (["1", "2", "4"] if name in close else ["1", "2"])
  md = report.markdown(result)
  assert "Where one trick needs another:" in md and f"Seeds [4] were added to both sides of {', '.join(close)}" in md


def test_recipe_md_quotes_each_fix_as_measured():
  """docs/recipe.md's table of the fixes: each row's difference and verdict as the record has them."""
  with open(os.path.join(ROOT, "docs", "results", "recipe", "variants-fixes-long.json")) as f:
    result = json.load(f)
  with open(os.path.join(ROOT, "docs", "recipe.md")) as f:
    text = f.read()
  table = text.split("<!-- fixes-table:start -->")[1].split("<!-- fixes-table:end -->")[0]
  rows = [line for line in table.strip().splitlines()[2:]]
  assert len(rows) == len(result["pairs"])
  for row, p in zip(rows, result["pairs"]):
    d = p["difference"]
    assert f"| {d['mean']:+.4f} ± {d['se_total']:.4f} se | {cells.verdict_word(d)} |" in row, (p["name"], row)
    assert f"(`{p['row']}`)" in row
  assert f"the median over its pairs) is about {result['resolution']:.4f}" in text
  pairs = {p["name"]: p for p in result["pairs"]}
  gpt2, fan_in = (pairs[k]["difference"]["mean"] for k in ("relu2_gpt2_init", "relu2"))
  assert f"({gpt2:+.4f} against {fan_in:+.4f} under the records' init)" in text
  per_seed = [[a - b for a, b in zip(pairs[k]["after"], pairs[k]["before"])] for k in ("relu2_gpt2_init", "relu2")]
  d = protocol.paired_difference(*per_seed)
  assert f"paired by seed, is {d['mean']:+.4f} ± {d['se']:.4f} se: {d['verdict']}" in text
  relu2 = pairs["relu2"]["difference"]
  page = " ".join(text.split())
  assert f'({relu2["mean"]:+.4f} ± {relu2["se_total"]:.4f} se, {cells.verdict_word(relu2)}): it read "higher"' in page
  with open(os.path.join(ROOT, "docs", "results", "verdicts-reread.json")) as f:  # as first published
    reread = json.load(f)["files"]["docs/results/recipe/variants-fixes-long.json"]
  assert next(r for r in reread if r["where"] == "pairs.relu2.difference")["old"] == "higher"
  assert result["code_version"]["anchor"] in text
  assert f"{result['runs_trained']} runs, {result['wall_s'] / 3600:.1f} h on 2 cores" in text
  pays = [p["name"] for p in result["pairs"] if p["difference"]["verdict"] == "lower"]
  assert pays == ["momentum_warmup", "attn_scale"]  # as recipe.md and the README name them
  with open(os.path.join(ROOT, "README.md")) as f:
    assert "(Muon's momentum warm-up and the attention scale pay;" in f.read()


@pytest.mark.slow  # one run of the published record (3000 steps of the long model, about 2 minutes)
def test_a_published_fix_run_gives_the_same_bits_on_todays_code():
  """recipe.md says the fixes, run on an earlier code version, stand for today's: one run re-run
  under a worker's conditions (one core, one XLA thread) gives the bits that run's own code gave on
  this machine kind (tests/data/variant_rerun_numerics.json, one record per machine kind: XLA:CPU's
  bits depend on the host CPU). On a kind with no record: the published bits, or, since the record
  does not name the kind that made them, the published losses to cross-CPU rounding."""
  r = subprocess.run(
    [sys.executable, os.path.join(ROOT, "scripts", "rerun_variant.py"), "init", "after", "1"],
    capture_output=True,
    text=True,
    timeout=1800,
    # The published runs' driver had no XLA_FLAGS; the suite's own (-O0, older emitters) round otherwise.
    env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"},
  )
  assert r.returncode == 0, r.stderr[-2000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  if out["same_bits_here"] is not None:
    assert out["same_bits_here"], r.stdout
  elif not out["same_bits"]:
    (today, published), (today_avg, published_avg) = out["final_raw"], out["final_averaged"]
    assert math.isclose(today, published, rel_tol=2e-3), r.stdout
    assert all(math.isclose(today_avg[b], published_avg[b], rel_tol=2e-3) for b in published_avg), r.stdout


def test_at_quick_the_study_is_refused_naming_the_smallest_preset_where_it_runs():
  """`quick` has no recipe record (its recipe trains two tricks on a one-layer model): the study is refused
  before anything runs, with the preset where it runs and the command; at that preset every check passes."""
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = "variants"
  smallest = variants_config.SMALLEST_PRESET
  with pytest.raises(ValueError) as refused:
    study.validate(c)
  message = str(refused.value)
  assert message.startswith("the variants study does not run at `quick`")
  assert f"The smallest preset where it runs is `{smallest}`" in message
  assert f"--config=experiments/configs/benchmark.py:{smallest} --config.benchmark.study=variants" in message
  assert "--config.benchmark.variants.lrs_from" in message
  there = benchmark_cfg.get_config(smallest)
  there.benchmark.study = "variants"
  study.validate(there)


def test_recipe_md_quotes_the_fix_runs_bits_as_recorded():
  with open(os.path.join(ROOT, "tests", "data", "variant_rerun_numerics.json")) as f:
    machine_records = json.load(f)
  with open(os.path.join(ROOT, "docs", "results", "recipe", "variants-fixes-long.json")) as f:
    pair = {p["name"]: p for p in json.load(f)["pairs"]}[machine_records["run"]["pair"]]
  published = pair["runs"][machine_records["run"]["side"]][machine_records["run"]["seed"]]
  with open(os.path.join(ROOT, "docs", "recipe.md")) as f:
    text = " ".join(f.read().split())
  (record,) = [r for r in machine_records["records"] if "AVX-512".replace("-", "").lower() in r["machine"]["cpu"]]
  assert record["machine"]["cpu"].startswith("AMD EPYC")
  assert published["key"] == machine_records["run"]["key"]
  assert f"final loss {record['final_raw']:.7f} against the published {published['final_raw']:.7f}" in text
