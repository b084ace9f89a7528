"""The optimizers study through the skeleton with a stub runner (nothing trains): each side on its own
curve, the per-budget re-checks, the extensions until each curve spans the other side's loss at N, the
factor and the verdict recomputed from the record."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re

import pytest
from conftest import ROOT, SpecRunner

from experiments.configs import benchmark as benchmark_cfg
from hybridjax import data as data_lib
from hybridjax.bench import factor, speedrun, study
from hybridjax.bench.studies.optimizers import carried, run

N = 40
K = 2.5  # the stub's Muon reaches AdamW's loss at K times fewer steps


def _config(tmp_path):
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = "optimizers"
  recipe = {"trick_list": 2, "tricks": ["schedule", "muon"], "step_runs": {}}
  recipe["step_runs"]["schedule"] = {"lr": 0.012, "beta": 0.99, "iterate": "averaged"}
  recipe["step_runs"]["muon"] = {"lr": 0.02, "beta": 0.995, "iterate": "averaged"}
  path = tmp_path / "recipe-quick.json"
  path.write_text(json.dumps(recipe))
  c.benchmark.optimizers.lrs_from = str(path)
  return c


def _stub_result(spec):
  """AdamW L = 2.5 + 0.8 (T/N)^-0.7, Muon the same at K T, each seed 0.01 apart; the published LR best
  (0.02 per sqrt(2) step away) but at AdamW's 3 N, where the LR above it wins, and AdamW's halved weight
  decay wins at 4 N. T counts tokens in N-step runs of the preset's batch (8); AdamW at a smaller batch is
  0.01 lower at equal tokens (above its critical batch), Muon the same. Every eval window scores a run's
  loss +- 0.02."""
  c = spec["config"]
  muon = c["optim"]["name"] == "muon_groups"
  steps, lr, batch = c["trainer"]["steps"], c["optim"]["learning_rate"], c["trainer"]["batch_size"]
  tokens = steps * batch / 8
  best_lr = 0.02 if muon else (0.012 * math.sqrt(2) if tokens == 3 * N else 0.012)
  loss = 2.5 + 0.8 * ((K if muon else 1.0) * tokens / N) ** -0.7 + 0.01 * (c["seed"] % 100)
  loss -= 0.01 if batch < 8 and not muon else 0.0
  loss += 0.02 * abs(math.log(lr / best_lr) / math.log(math.sqrt(2)))
  if not muon and tokens == 4 * N and c["optim"]["weight_decay"] < 0.1:
    loss -= 0.005
  windows = [loss + 0.02 * (-1) ** j for j in range(2 * c["trainer"]["eval_batches"])]
  return {
    "seed": c["seed"],
    "steps": steps,
    "lr": lr,
    "curve": [{"step": steps, "eval_loss_raw": loss + 0.01, "eval_loss_averaged": loss}],
    "final_raw": loss + 0.01,
    "final_averaged": {str(b): loss for b in spec["betas"]},
    "final_averaged_per_batch": windows,
  }


@pytest.fixture
def ran(tmp_path, monkeypatch):
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  c.benchmark.optimizers.draws = 200
  return study.run(c, str(tmp_path / "work")), runner, tmp_path


@pytest.mark.slow  # the study through the skeleton on stub runs, with the corpus's preparation (seconds)
def test_each_side_on_its_own_curve_extended_until_it_spans_the_other_sides_loss_at_n(ran):
  result, runner, tmp_path = ran
  adamw, muon = result["sides"]["adamw"], result["sides"]["muon"]
  # Muon at N is AdamW at K N = 2.5 N, inside AdamW's budgets (to 3 N): no extension. AdamW at N is Muon at
  # N / K = 0.4 N, below Muon's smallest budget (0.5 N): Muon's curve is extended down to 0.25 N.
  assert adamw["budgets"] == [0.75, 1.0, 2.0, 3.0] and muon["budgets"] == [0.25, 0.5, 1.0]
  assert result["extended"] == {"adamw": [], "muon": [0.25]}
  # The re-checks at every budget but N: the LR at its neighbours and (AdamW's, Muon's being 0) the weight
  # decay at lambda N / T, on the three tuning seeds; AdamW's LR moves at 3 N, where its neighbour wins beyond
  # the (here zero) paired noise.
  assert sorted(adamw["rechecks"]) == ["0.75", "2.0", "3.0"] and sorted(muon["rechecks"]) == ["0.25", "0.5"]
  assert [len(c["tried"]) for c in adamw["rechecks"].values()] == [4, 4, 4]
  assert [len(c["tried"]) for c in muon["rechecks"].values()] == [3, 3]
  assert adamw["per_budget"]["3.0"]["lr"] == pytest.approx(0.01697) and adamw["per_budget"]["2.0"]["lr"] == 0.012
  assert adamw["rechecks"]["3.0"]["best_difference"]["wins"]
  assert adamw["measurement_runs"] == pytest.approx(3 * 4 * (0.75 + 2 + 3))
  assert muon["measurement_runs"] == pytest.approx(3 * 3 * (0.5 + 0.25))
  # No headline run on a tuning seed, no re-check on a headline seed.
  seeds = {json.loads(json.dumps(s["config"]))["seed"] for s in runner.specs}
  assert seeds == {21, 22, 1001, 1002, 1003}
  f = result["factor"]
  for reading in ("a", "b"):  # the stub's curves are of the fitted form: both readings are K, on every seed
    assert f[reading]["bound"] is None and f[reading]["per_seed"] == pytest.approx([K, K], rel=1e-3)
    # the raw iterates (the stub's averaged loss + 0.01 on both sides, its curve's level) read K too
    assert result["factor_raw"][reading]["per_seed"] == pytest.approx([K, K], rel=1e-3)
  # today's verdict against 1.0x, the field's range beside it (the stub's 2.5x lies above it)
  against = result["verdict_against_one"]
  assert result["verdict"] == against["verdict"] == "above 1.0×" and against["against_field"] == "above"
  assert against == factor.verdict_against_one(f["a"], run.field_range())
  # Every figure recomputes from the record; the md is the record's.
  written = json.loads((tmp_path / "work" / "optimizers-as_published-quick.json").read_text())
  assert json.loads(json.dumps(run.cell_figures(written))) == {
    k: written[k] for k in ("factor", "verdict", "factor_raw", "interpolated", "verdict_against_one")
  }
  assert (tmp_path / "work" / "optimizers-as_published-quick.md").read_text() == run.markdown(written) + "\n"
  assert written["corpus"]["tokens"] > 0 and written["cell"]["batch"] == [8, 32]


@pytest.mark.slow  # as above
def test_a_curve_that_falls_short_is_extended_and_its_extension_rechecked(tmp_path, monkeypatch):
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  c.benchmark.optimizers.update(draws=200, adamw_budgets=(0.75, 1.0, 2.0), muon_budgets=(0.75, 1.0))
  result = study.run(c, str(tmp_path / "work"))
  adamw, muon = result["sides"]["adamw"], result["sides"]["muon"]
  assert result["extended"] == {"adamw": [4.0], "muon": [0.25]}
  assert adamw["budgets"] == [0.75, 1.0, 2.0, 4.0] and muon["budgets"] == [0.25, 0.75, 1.0]
  assert adamw["per_budget"]["4.0"]["weight_decay"] == 0.025  # the weight decay at lambda N / T wins there
  assert "0.25" in muon["rechecks"]


@pytest.mark.slow  # the study and its joint search through the skeleton on stub runs (seconds)
def test_both_tuned_searches_both_sides_alike_at_equal_cost_then_runs_their_curves(tmp_path, monkeypatch):
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  c.benchmark.tuner = "joint"
  c.benchmark.optimizers.update(draws=200, cell="both_tuned")
  result = study.run(c, str(tmp_path / "work"))
  adamw, muon = result["sides"]["adamw"], result["sides"]["muon"]
  # Both sides searched from their published settings, at costs within one configuration (two N runs).
  assert adamw["tuning_runs"] > 50 and abs(adamw["tuning_runs"] - muon["tuning_runs"]) < 2
  assert (
    adamw["search"]["totals"]
    == muon["search"]["totals"]
    == {"adamw": adamw["tuning_runs"], "muon": muon["tuning_runs"]}
  )
  for rec in (adamw, muon):
    assert rec["settings"]["published"]["row"] == rec["settings"]["row"]
    assert rec["settings"]["lr"] == rec["search"]["chosen"]["fields"]["optim.learning_rate"]
    assert rec["search"]["settings"][0]["origin"] == "published"
  # The search ran on its own seeds alone, the curves on the headline seeds, the re-checks on the tuning seeds.
  searched = {r["seed"] for rec in (adamw, muon) for r in rec["search"]["runs"]}
  assert searched <= {1001, 1002, 1003, 1004} and not searched & set(result["seeds"])
  seeds = {s["config"]["seed"] for s in runner.specs}
  assert seeds <= {21, 22, 23, 1001, 1002, 1003, 1004}
  assert result["search_seeds"] == [1001, 1002, 1003, 1004]
  # The headline runs alone end with the wide eval (8 times the windows).
  assert {s["config"]["seed"] for s in runner.specs if s.get("wide_eval") == 8} == set(result["seeds"])
  assert all("wide_eval" not in s for s in runner.specs if s["config"]["seed"] not in result["seeds"])
  # The stub's best LRs are found (AdamW 0.012 at N, Muon 0.02), and the cell reads its factor as before.
  assert abs(math.log(muon["settings"]["lr"] / 0.02)) < 0.2 and abs(math.log(adamw["settings"]["lr"] / 0.012)) < 0.2
  written = json.loads((tmp_path / "work" / "optimizers-both_tuned-quick.json").read_text())
  assert json.loads(json.dumps(run.cell_figures(written))) == {
    k: written[k] for k in ("factor", "verdict", "factor_raw", "interpolated", "verdict_against_one")
  }
  md = (tmp_path / "work" / "optimizers-both_tuned-quick.md").read_text()
  assert md == run.markdown(written) + "\n" and "| adamw | " + f"{adamw['tuning_runs']:.1f} |" in md


def _both_tuned_first(tmp_path, monkeypatch):
  """(the stub runner, its specs cleared, cell both_tuned's result at quick and its record's path): what a
  carried cell starts from."""
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  c.benchmark.tuner = "joint"
  c.benchmark.optimizers.update(draws=200, cell="both_tuned")
  before = study.run(c, str(tmp_path / "work"))
  runner.specs.clear()
  return runner, before, str(tmp_path / "work" / "optimizers-both_tuned-quick.json")


@pytest.mark.slow  # cell both_tuned, then cell small_batch from its record, through the skeleton on stubs (seconds)
def test_small_batch_converts_the_tuned_settings_checks_them_locally_and_locates_the_critical_batch(
  tmp_path, monkeypatch
):
  runner, before, path = _both_tuned_first(tmp_path, monkeypatch)
  c = _config(tmp_path)
  c.benchmark.optimizers.update(draws=200, cell="small_batch", batch_size=4, settings_from=path)
  result = study.run(c, str(tmp_path / "work"))
  # The same tokens: N = 40 steps of 8 windows become 80 of 4, the eval's 2 batches 4 of the same windows.
  assert result["steps"] == 2 * N and result["cell"]["batch"] == [4, 32]
  assert result["cell"]["eval_batches"] == 4 and result["cell"]["eval_groups"] == 2
  assert {s["config"]["trainer"]["batch_size"] for s in runner.specs} == {4}
  assert {s["config"]["trainer"]["eval_batches"] for s in runner.specs} == {4}
  for side in ("adamw", "muon"):
    rec, was = result["sides"][side], before["sides"][side]["settings"]
    fields = rec["settings"]["fields"]
    # a decay per step d becomes d ** (4 / 8) at the same tokens; the warm-up keeps its tokens
    b2 = "optim.b2" if side == "adamw" else "optim.tied_b2"
    b1 = "optim.b1" if side == "adamw" else "optim.tied_b1"
    assert fields[b1] == pytest.approx(was["fields"][b1] ** 0.5, abs=1e-7)
    assert rec["settings"]["beta"] == pytest.approx(was["beta"] ** 0.5, abs=1e-7)
    assert fields["optim.warmup_steps"] == 2 * was["fields"]["optim.warmup_steps"]
    if side == "muon":
      assert fields["optim.muon_momentum"] == pytest.approx(was["fields"]["optim.muon_momentum"] ** 0.5, abs=1e-7)
    # the local check: 3 LRs x beta2 {converted, unconverted}, on the tuning seeds at N, counted as tuning
    tried = rec["local_check"]["tried"]
    assert {t["fields"][b2] for t in tried} == {round(was["fields"][b2] ** 0.5, 7), was["fields"][b2]}
    assert 6 <= len(tried) <= 6 + carried.LR_MOVES and rec["tuning_runs"] == 3.0 * len(tried)
    assert rec["settings"]["lr"] == rec["local_check"]["chosen"]["optim.learning_rate"]
  # No headline run on a tuning seed; the local check on the tuning seeds alone.
  assert {s["config"]["seed"] for s in runner.specs} <= {21, 22, 23, 1001, 1002, 1003}
  # AdamW is 0.01 lower at the smaller batch (on every seed, every window): the larger is above its critical
  # batch; Muon is the same.
  crit = result["critical_batch"]
  assert crit["adamw"]["verdict"] == "lower" and crit["adamw"]["mean"] == pytest.approx(-0.01, abs=1e-6)
  assert "8 windows per step are above this model's critical batch for adamw" == crit["adamw"]["reading"]
  assert crit["muon"]["verdict"] == "no difference"
  written = json.loads((tmp_path / "work" / "optimizers-small_batch-quick.json").read_text())
  assert json.loads(json.dumps(run.cell_figures(written))) == {
    k: written[k] for k in ("factor", "verdict", "factor_raw", "interpolated", "verdict_against_one")
  }
  md = (tmp_path / "work" / "optimizers-small_batch-quick.md").read_text()
  assert md == run.markdown(written) + "\n" and "above this model's critical batch" in md
  # the same command publishes over its own record (which keeps the config as given), not over another's
  c.benchmark.publish = str(tmp_path / "work")
  study.validate(c)
  c.benchmark.optimizers.draws = 100
  with pytest.raises(ValueError, match=r"optimizers-small_batch-quick\.json, a record of another config \(benchmark"):
    study.validate(c)
  c.benchmark.optimizers.draws, c.benchmark.publish = 200, ""
  # a record of another token budget is refused: the cells compare at equal tokens on the same windows
  other = json.loads((tmp_path / "work" / "optimizers-both_tuned-quick.json").read_text()) | {"steps": 2 * N}
  (tmp_path / "other.json").write_text(json.dumps(other))
  c.benchmark.optimizers.settings_from = str(tmp_path / "other.json")
  with pytest.raises(ValueError, match=r"settings_from=.*other\.json: its runs read 80 steps of 8 × 32 tokens"):
    study.validate(c)


def _corpus(path, train_bytes):
  words = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex a jovial bard".split()
  for split, size in (("train", train_bytes), ("val", 20_000)):
    (path / split).mkdir(parents=True)
    for k in range(4):
      text = " ".join(words[(j * 7 + k) % len(words)] for j in range(size // 20))
      (path / split / f"doc{k}.txt").write_text(text)
  (path / "SOURCES.json").write_text("{}")
  return str(path)


@pytest.mark.slow  # cell both_tuned, then cell corpus from its record, through the skeleton on stubs (seconds)
def test_corpus_carries_the_tuned_settings_to_a_second_corpus_read_without_repeats(tmp_path, monkeypatch):
  runner, before, path = _both_tuned_first(tmp_path, monkeypatch)
  c = _config(tmp_path)
  # too small for the largest budget (4 N = 160 steps of 8 windows of 33 tokens, about 42k tokens)
  small = _corpus(tmp_path / "small", 20_000)
  c.benchmark.optimizers.update(draws=200, cell="corpus", settings_from=path, corpus_path=small)
  with pytest.raises(ValueError, match=r"data\.order='no_repeat': 160 steps of 8 windows need 1280 .*largest budget"):
    study.validate(c)
  c.benchmark.optimizers.corpus_path = str(tmp_path / "none")
  with pytest.raises(ValueError, match=r"corpus_path=.*none: no corpus .*`python scripts/build_corpus\.py --out"):
    study.validate(c)
  for split in ("train", "val"):
    (tmp_path / "empty" / split).mkdir(parents=True)
  c.benchmark.optimizers.corpus_path = str(tmp_path / "empty")
  with pytest.raises(ValueError, match=r"corpus_path=.*empty: data\.path .*empty/train' is a folder with no non-empty"):
    study.validate(c)
  c.benchmark.optimizers.corpus_path = _corpus(tmp_path / "corpus", 200_000)
  c.data.path = small  # the cell's corpus is its own field's; a data.path beside it would be replaced unseen
  with pytest.raises(ValueError, match=r"data\.path=.*small: cell 'corpus' trains on .*corpus_path \(.*corpus\)"):
    study.validate(c)
  c.data.path = ""
  result = study.run(c, str(tmp_path / "work"))
  assert {(s["config"]["data"]["path"], s["config"]["data"]["order"]) for s in runner.specs} == {
    (c.benchmark.optimizers.corpus_path, "no_repeat")
  }
  assert result["steps"] == N and result["cell"]["batch"] == [8, 32] and "critical_batch" not in result
  assert result["corpus"]["name"] == c.benchmark.optimizers.corpus_path and result["corpus"]["max_epochs"] < 1
  # the record names its corpus by content too: another machine's copy is known to be the same text
  prepared = data_lib.prepare_corpus(c.benchmark.optimizers.corpus_path, str(c.data.tokenizer), str(c.data.cache_dir))
  assert result["corpus"]["content_hash"] == prepared.meta["content_hash"] != before["corpus"]["content_hash"]
  for side in ("adamw", "muon"):
    rec, was = result["sides"][side], before["sides"][side]["settings"]
    assert rec["settings"]["beta"] == was["beta"]  # nothing converted: the same batch
    assert {k: v for k, v in rec["settings"]["fields"].items() if k != "optim.learning_rate"} == {
      k: v for k, v in was["fields"].items() if k != "optim.learning_rate"
    }
    tried = rec["local_check"]["tried"]  # the LR at its neighbours, moved on past a winning edge
    assert 3 <= len(tried) <= 3 + carried.LR_MOVES and rec["tuning_runs"] == 3.0 * len(tried)
  written = json.loads((tmp_path / "work" / "optimizers-corpus-quick.json").read_text())
  md = (tmp_path / "work" / "optimizers-corpus-quick.md").read_text()
  assert md == run.markdown(written) + "\n" and "unconverted, then each side's LR" in md
  # A re-run publishes over its own record, not over one of another corpus at the same path.
  c.benchmark.publish = str(tmp_path / "work")
  study.validate(c)
  with open(os.path.join(c.benchmark.optimizers.corpus_path, "train", "doc0.txt"), "a") as f:
    f.write(" and one more sentence")
  with pytest.raises(
    ValueError, match=r"optimizers-corpus-quick\.json, a record of another corpus \(corpus\.content_hash"
  ):
    study.validate(c)


def test_the_local_check_moves_its_lr_past_a_winning_edge_only():
  def tried(losses):  # {lr: two-seed losses} at one beta2
    return [{"fields": {"optim.learning_rate": lr, "optim.b2": 0.999}, "losses": [x, x]} for lr, x in losses.items()]

  assert carried._next_lr(tried({0.004: 2.0, 0.002828: 1.9, 0.005657: 2.1}), "optim.b2") == 0.002
  assert carried._next_lr(tried({0.004: 2.0, 0.002828: 2.1, 0.005657: 1.9}), "optim.b2") == 0.008
  assert carried._next_lr(tried({0.004: 1.8, 0.002828: 2.1, 0.005657: 1.9}), "optim.b2") is None
  # the edge is read among the LRs tried at the best setting's beta2
  other = [{"fields": {"optim.learning_rate": 0.001, "optim.b2": 0.99}, "losses": [2.5, 2.5]}]
  assert carried._next_lr(tried({0.004: 2.0, 0.002828: 1.9}) + other, "optim.b2") == 0.002


def test_the_local_check_moves_its_lr_on_at_most_lr_moves_times_and_records_the_limit():
  """A side whose loss falls with its LR without end moves LR_MOVES sqrt(2) steps past its first edge
  neighbour and stops there; the record names the limit, and benchmark.md gives it in words."""
  c = benchmark_cfg.get_config("quick")
  settings = {"lr": 0.004, "fields": {"optim.b2": 0.999}, "beta2_unconverted": 0.95, "beta": 0.99, "iterate": "raw"}
  runner = SpecRunner(lambda s: {"final_raw": 100 * s["config"]["optim"]["learning_rate"], "seed": s["config"]["seed"]})
  _, checks = carried.local_check(c, {"adamw": (c, settings)}, runner)
  check = checks["adamw"]
  assert check["lr_moves"] == check["lr_moves_limit"] == carried.LR_MOVES == 4
  assert len(check["tried"]) == 6 + carried.LR_MOVES and check["search_runs"] == 3.0 * len(check["tried"])
  lowest = 0.004 / math.sqrt(2) ** (1 + carried.LR_MOVES)
  assert check["chosen"] == {"optim.learning_rate": pytest.approx(lowest, rel=2e-3), "optim.b2": 0.999}
  page = " ".join(open(os.path.join(ROOT, "docs", "benchmark.md"), encoding="utf-8").read().split())
  assert "at the edge of the LRs tried, at most four times (`LR_MOVES`" in page


def test_bad_blocks_are_refused_naming_the_field(tmp_path):
  for fields, match in (
    ({"adamw_budgets": (0.5, 2.0)}, r"optimizers\.adamw_budgets=.*N \(1\.0\) among them"),
    ({"muon_extensions": (0.6,)}, r"optimizers\.muon_extensions=.*below the smallest"),
    ({"tuning_seeds": (21,)}, r"optimizers\.tuning_seeds=.*nothing is tuned on a headline seed"),
    ({"adamw_row": "muon"}, r"the AdamW row must train AdamW"),
    (
      {"cell": "tuned"},
      r"optimizers\.cell must be one of \['as_published', 'both_tuned', 'small_batch', 'corpus', "
      r"'sides'\]",
    ),
    ({"cell": "small_batch", "batch_size": 3}, r"optimizers\.batch_size=3: .*divides its 320 training windows"),
    ({"cell": "small_batch", "batch_size": 4}, r"optimizers\.settings_from: no cell 'both_tuned' record at"),
    ({"muon_budgets": (0.5, 0.51, 1.0)}, r"each budget must round to its own positive step count"),
    ({"cell": "both_tuned"}, r"--config\.benchmark\.tuner='lr': cell 'both_tuned' reads tuner 'joint'"),
    ({"search_seeds": (1001, 1002, 21)}, r"optimizers\.search_seeds=.*none a headline or plateau seed"),
    ({"spare_seed": 1003}, r"optimizers\.search_seeds=.*a fourth spare one"),
    ({"search_configs": 8}, r"optimizers\.search_configs must be >= 24, got 8"),
    ({"batch_size": 4}, r"optimizers\.batch_size=4 has no effect: cell 'as_published' does not read it"),
    ({"search_configs": 30}, r"optimizers\.search_configs=30 has no effect: .*only 'both_tuned'"),
  ):
    c = _config(tmp_path)
    with pytest.raises(ValueError, match=match):  # a field's own check at the assignment, the others at the start
      c.benchmark.optimizers.update(fields)
      study.validate(c)
  c = _config(tmp_path)
  c.benchmark.tuner = "joint"
  with pytest.raises(ValueError, match=r"cell 'as_published' reads tuner 'lr' \(it searches nothing\)"):
    study.validate(c)
  c = _config(tmp_path)
  c.benchmark.update(study="family", tuner="joint")
  with pytest.raises(
    ValueError,
    match=r"--config\.benchmark\.tuner='joint': the family study tunes with lr; .*runs it: knobs, optimizers\)",
  ):
    study.validate(c)
  c = _config(tmp_path)
  with pytest.raises(ValueError, match=r"--config\.benchmark\.tuner must be 'lr' .*, got 'grid'"):
    c.benchmark.tuner = "grid"  # at the assignment, as on the command line
  c = _config(tmp_path)
  c.benchmark.optimizers.adamw_row = "rotary"
  with pytest.raises(ValueError, match=r"holds no 'rotary' step .*optimizers\.adamw_row"):
    study.validate(c)
  assert speedrun.TRICKS  # the rows are the recipe's steps


def test_what_benchmark_md_says_a_cell_needs_at_quick_is_what_the_checks_take(tmp_path):
  """docs/benchmark.md's recipe for a carried cell at `quick`: the batch it names is below quick's and
  divides its windows (the default, `long`'s, does not), and with no `settings_from` the cell names the
  missing cell `both_tuned` record."""
  from hybridjax.bench.studies.optimizers import carried

  with open(os.path.join(ROOT, "docs", "benchmark.md")) as f:
    page = " ".join(f.read().split())
  quick, long = (benchmark_cfg.get_config(p) for p in ("quick", "long"))
  default, small = long.benchmark.optimizers.batch_size, quick.trainer.batch_size // 4
  assert (
    f"(the default {default} is for `long`'s {long.trainer.batch_size}: give {small} at `quick`, whose batch is "
    f"{quick.trainer.batch_size})"
  ) in page
  c = _config(tmp_path)
  c.benchmark.optimizers.cell = "small_batch"
  assert f"(e.g. {small})" in carried.batch_errors(c, 3.0, "small_batch")[0]  # the refusal names it too
  c.benchmark.optimizers.batch_size = small
  assert carried.batch_errors(c, 3.0, "small_batch") == []
  with pytest.raises(ValueError, match=r"settings_from: no cell 'both_tuned' record at"):
    study.validate(c)


def test_the_docs_name_every_field_of_the_block_and_its_defaults():
  with open(os.path.join(ROOT, "docs", "config.md")) as f:
    reference = f.read()  # the generated reference lists every field of the block
  block = benchmark_cfg.get_config("long").benchmark.optimizers
  assert sorted(re.findall(r"\| `benchmark\.optimizers\.(\w+)` \|", reference)) == sorted(block)
  with open(os.path.join(ROOT, "docs", "benchmark.md")) as f:
    page = f.read()
  section = " ".join(page.split("## Muon over AdamW, each on its own curve", 1)[1].split("\n## ", 1)[0].split())
  assert f"adamw_row`, `{block.adamw_row}`" in section
  assert f"`tuning_seeds` ({block.tuning_seeds[0]}–{block.tuning_seeds[-1]})" in section
  assert f"(`seeds`, {block.seeds[0]}–{block.seeds[-1]})" in section
  assert f"`plateau_seeds` ({block.plateau_seeds[0]}, {block.plateau_seeds[1]})" in section
  assert f"`adamw_extensions` ({', '.join(f'{x:g} N' for x in block.adamw_extensions)})" in section
  assert f"`muon_extensions` ({', '.join(f'{x:g} N' for x in block.muon_extensions)})" in section
  assert f"`adamw_budgets` ({block.adamw_budgets[0]:g}–{block.adamw_budgets[-1]:g} N)" in section
  assert f"`muon_budgets` ({block.muon_budgets[0]:g}–{block.muon_budgets[-1]:g} N)" in section
  assert f"above {factor.FIELD:g}×" in section
  assert f"at `batch_size` ({block.batch_size}) windows per step" in section
