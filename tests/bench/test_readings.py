"""How a study reads its figures, cell by cell: a control equal to its anchor, a loss above the curve's
start, the eval set's error of a difference (and one eval batch, which cannot estimate it), the one-line
verdicts; and every published result reads as the current code reads it (scripts/reread_results.py)."""

from __future__ import annotations

import json
import math
import os

import chex
import numpy as np
import pytest
from conftest import ROOT, load_script

# The quick protocol's averaged anchor, as a run recorded it: on seed 1 the N-step loss (40 steps) lies
from hybridjax.bench import cells, figures, protocol, tuning

# The quick protocol's averaged anchor, as a run recorded it: on seed 1 the N-step loss (40 steps) lies
from hybridjax.bench.studies.family import report as family_report

# The quick protocol's averaged anchor, as a run recorded it: on seed 1 the N-step loss (40 steps) lies
# above the 20-step one, on seed 2 the 50-step loss above the 40-step one (a flat stretch from N).
BUDGETS = [20, 40, 50, 80]
ANCHOR = {
  "1": [3.4012084007263184, 3.4475488662719727, 3.384679079055786, 3.303293228149414],
  "2": [3.4029784202575684, 3.3732447624206543, 3.380293846130371, 3.3620588779449463],
}


def _equal_control(eps: float = 2e-7) -> dict[str, dict[str, float]]:
  """A control arm whose final loss is the anchor's at N up to float rounding, N backward passes."""
  return {
    s: {
      "final_loss": curve[1] + eps,
      "final_raw": curve[1] + eps,
      "backward_passes": 40,
      "validation_forwards": 0,
      "steps": 40,
      "step_kinds": {"real_step": 40},
    }
    for s, curve in ANCHOR.items()
  }


def test_a_control_equal_to_its_anchor_reads_1x_and_no_difference_and_says_why():
  """The reported case: the control read 1.25x on seed 2 (a hair below the flat stretch 40-50, read at
  its far end) and 'not reached', then '≤ 0.75×', on seed 1 (its anchor's N-step loss lies above the
  curve's start, so the anchor read 20 steps against itself). Now both seeds read 1.00x (read as the
  anchor reads itself at N), the cell says the anchor's own N-step loss lies above its envelope on
  seed 1, and the verdict is 'no difference'."""
  curves = {a: ANCHOR for a in figures.ANCHORS}
  timing = {"baseline": {"baseline": 10.0}, "method": {"real_step": 10.0}}
  f = figures.method_figures(curves, _equal_control(), timing, BUDGETS, eval_se=0.0418)["averaged_baseline"]
  for row in ("backward_ratio", "pass_ratio", "wallclock_ratio"):
    values = [r["value"] for r in f["per_seed"][row]]
    chex.assert_trees_all_close(np.array(values), np.array([1.0, 1.0]), atol=1e-12)
    assert not any(r["upper_bound"] or r["lower_bound"] for r in f["per_seed"][row]), row
  assert f["verdict"]["verdict"] == "no difference"
  assert f["verdict"]["anchor_above_envelope_at_n"] == [True, False]
  cell = cells.ratio_cell(f["pass_ratio"], f["verdict"])
  assert cell == "1.00× ± 0.00 sd (anchor at N above its envelope: 1/2 seeds)"
  (line,) = family_report.family_verdicts({"figures": {"skip_control": {"averaged_baseline": f}}})[2:]
  assert line == (
    "* `skip_control`: **no difference** (pass ratio 1.00× ± 0.00 sd against the averaged "
    f"anchor; loss at its passes +0.0000 ± 0.0418 se from the anchor's curve{cells.p_note(f['verdict']['paired'])}; "
    "anchor at N above its envelope: 1/2 seeds)"
  )
  # Bit for bit equal too. On the seed above its envelope every reading is scaled alike, by N over the
  # steps the anchor's own N-step loss reads (40 / 20 here): the 50-step loss reads 100 steps, not 50.
  exact = _equal_control(eps=0.0)
  f = figures.method_figures(curves, exact, None, BUDGETS, eval_se=0.0418)["baseline"]
  assert f["pass_ratio"]["values"] == [1.0, 1.0]
  assert protocol.steps_to_reach(BUDGETS, ANCHOR["1"], ANCHOR["1"][2]).steps == 50
  assert protocol.steps_to_reach_at_n(BUDGETS, ANCHOR["1"], ANCHOR["1"][2], 40).steps == 100
  # Where the anchor drops at N (seed 2) the reading is the plain one.
  for loss in ANCHOR["2"]:
    assert protocol.steps_to_reach_at_n(BUDGETS, ANCHOR["2"], loss, 40) == protocol.steps_to_reach(
      BUDGETS, ANCHOR["2"], loss
    )
  # The paired difference at N of two runs 2e-7 apart on both seeds: "higher" on the seeds' spread alone
  # (both differences have one sign and almost no spread), "no difference" with the eval set's error.
  assert protocol.paired_difference([x + 2e-7 for x in (1.0, 2.0)], [1.0, 2.0])["verdict"] == "higher"
  assert f["paired_difference"]["verdict"] == "no difference"


def test_an_arm_that_does_not_pay_reads_so_in_one_line():
  """An arm 0.01 above the anchor's curve at N on both seeds, with the eval error well below that."""
  curves = {a: {"1": [3.0, 2.5, 2.4, 2.2], "2": [3.1, 2.6, 2.45, 2.3]} for a in figures.ANCHORS}
  runs = _equal_control()
  for s, r in runs.items():
    r["final_loss"] = curves["averaged_baseline"][s][1] + 0.01
  f = figures.method_figures(curves, runs, None, BUDGETS, eval_se=0.001)["averaged_baseline"]
  assert f["verdict"]["verdict"] == "does not pay" and f["pass_ratio"]["mean"] < 1
  (line,) = family_report.family_verdicts({"figures": {"arm": {"averaged_baseline": f}}})[2:]
  assert line.startswith("* `arm`: **does not pay** (pass ratio 0.9")
  paired = f["verdict"]["paired"]
  assert paired["rule"] == "t" and paired["p"] < 0.05
  assert f"loss at its passes +0.0100 ± 0.0010 se from the anchor's curve, p {paired['p']:.2g})" in line


def _anchor_run(per_batch: list[float]) -> dict[str, object]:
  return {
    "final_averaged_per_batch": per_batch,
    "eval_batches": len(per_batch),
    "eval_batch_std": float(np.std(per_batch, ddof=1)) if len(per_batch) > 1 else 0.0,  # as anchor_run records
  }


def test_one_eval_batch_cannot_estimate_the_eval_error_and_says_so():
  runs = {f"{s}/{b}": _anchor_run([3.0 - 0.01 * b / 40]) for s in ("1", "2") for b in BUDGETS}
  record = figures.eval_errors(runs, ["1", "2"], BUDGETS, 40)
  assert record["paired_se"] is None and record["sampling_se"] is None and record["batches"] == 1
  assert record["budgets"] == [40, 50]
  note = cells.eval_note(record)
  assert note == (
    "The eval set's error of a difference cannot be estimated (one eval batch): a difference reads a direction "
    f"only {cells.BEYOND} of the seeds' spread alone, p beside each word."
  )
  assert "0.0000" not in note
  # The tuning's noise floor: the seeds' spread alone, never a 0.0 floor read as an estimate.
  noise = tuning.difference_noise([3.40, 3.41], runs["1/40"], runs["1/50"])
  assert noise["eval_paired_se"] is None and noise["noise"] == pytest.approx(0.01 / math.sqrt(2))
  t = {"seed_noise": noise["noise"], "seed_spread": noise["seed_spread"], "eval_paired_se": None}
  assert "the best two LRs' runs (cannot be estimated (one eval batch))" in family_report.tuning_noise(t)


def test_the_eval_error_of_a_difference_is_the_paired_per_batch_one():
  """Two runs on the same 48 batches: the batches' difficulty (spread 0.3) cancels in their difference,
  so the error a difference carries is the per-batch difference's standard error, not one loss's."""
  rng = np.random.default_rng(0)
  difficulty = rng.normal(3.0, 0.3, size=48)
  runs = {}
  for s in ("1", "2"):
    for b in BUDGETS:
      runs[f"{s}/{b}"] = _anchor_run((difficulty - 0.001 * b + rng.normal(0, 0.01, size=48)).tolist())
  record = figures.eval_errors(runs, ["1", "2"], BUDGETS, 40)
  expected = np.mean(
    [
      protocol.paired_batch_se(runs[f"{s}/40"]["final_averaged_per_batch"], runs[f"{s}/50"]["final_averaged_per_batch"])
      for s in ("1", "2")
    ]
  )
  assert record["paired_se"] == pytest.approx(expected) and record["paired_se"] < 0.005
  assert record["sampling_se"] > 0.03  # one loss's: ten times the paired one, and not what judges a difference
  note = cells.eval_note(record)
  assert f"{record['paired_se']:.4f}" in note and f"{record['sampling_se']:.4f}" not in note
  noise = tuning.difference_noise([3.40, 3.4001], runs["1/40"], runs["1/50"])
  assert (
    noise["noise"]
    == noise["eval_paired_se"]
    == pytest.approx(
      protocol.paired_batch_se(runs["1/40"]["final_averaged_per_batch"], runs["1/50"]["final_averaged_per_batch"])
    )
  )


def test_every_published_result_reads_as_the_current_code_reads_it():
  """scripts/reread_results.py's output for every published family, ladder and recipe is what is
  committed: each figure, each table, each verdict line (the ladder and recipe tests recompute their
  figures too; this covers the families' benchmark.json, headline.json and results.md)."""
  script = load_script("reread_results")
  stale = []
  for path, text, _ in script.rewrites():
    with open(path) as f:
      if f.read() != text:
        stale.append(os.path.relpath(path, ROOT))
  assert not stale, f"{stale} differ from their re-reading: run `python scripts/reread_results.py`"


def test_every_published_study_ends_with_a_verdict_per_arm():
  results = os.path.join(ROOT, "docs", "results")
  for folder in sorted(os.listdir(results)):
    path = os.path.join(results, folder, "benchmark.json")
    if not os.path.exists(path):
      continue
    with open(path) as f:
      stored = json.load(f)
    with open(os.path.join(results, folder, "results.md")) as f:
      md = f.read()
    verdicts = md.split("## Verdicts (against the averaged anchor)", 1)[1]
    for m in stored["figures"]:
      assert f"* `{m}`: **" in verdicts, (folder, m)
  for kind in ("ladder", "recipe"):
    for name in sorted(os.listdir(os.path.join(results, kind))):
      if name.endswith(".md"):
        with open(os.path.join(results, kind, name)) as f:
          verdicts = f.read().split("## Verdicts", 1)[1]
        assert verdicts.count("\n* ") >= 3, name


def test_a_jump_arm_with_fewer_than_3_jumps_per_run_reads_not_exercised():
  """The mean of the headline runs' accepted jumps: 2 per run marks the arm "not exercised" in its table
  cells and its verdict line (the comparison tested nothing of its jumps); 3 per run (2 and 4) does not;
  an arm whose runs record no jumps is not judged."""
  assert figures.MIN_JUMPS_PER_RUN == 3
  curves = {a: ANCHOR for a in figures.ANCHORS}

  def arm(jumps: list[int] | None) -> dict:
    runs = _equal_control()
    if jumps is not None:
      for r, k in zip(runs.values(), jumps):
        r.update(jumps=k, method_stats=["jumps"])
    return figures.method_figures(curves, runs, None, BUDGETS, eval_se=0.0418)

  few, enough, none = arm([2, 2]), arm([2, 4]), arm(None)
  assert few["exercise"] == {"jumps_per_run": 2.0, "minimum": 3, "exercised": False}
  assert enough["exercise"] == {"jumps_per_run": 3.0, "minimum": 3, "exercised": True}
  assert "exercise" not in none
  assert cells.exercise_mark(few) == "not exercised (2.0 jumps per run)"
  assert cells.exercise_mark(enough) == cells.exercise_mark(none) == ""
  result = {"figures": {"few": few, "enough": enough, "none": none}}
  lines = family_report.family_verdicts(result)[2:]
  assert lines[0].startswith(
    "* `few`: **no difference** (not exercised (2.0 jumps per run): the comparison tested nothing of its jumps; "
    "pass ratio"
  )
  for line in lines[1:]:
    assert "exercised" not in line and "tested nothing" not in line
  # The verdict cells of the family table carry the mark; the headline (a jump arm first) too.
  assert cells.with_exercise("+0.00% (no difference)", few) == (
    "+0.00% (no difference); not exercised (2.0 jumps per run)"
  )
  assert cells.with_exercise("+0.00% (no difference)", enough) == "+0.00% (no difference)"
  assert figures.exercise([{"jumps": None}, {"final_loss": 1.0}]) is None


def test_an_arm_meant_to_predict_whose_runs_predicted_no_step_reads_not_exercised():
  """A predicting arm (a velocity arm, a user's method with a `predict_step`) whose headline runs took
  every step with a backward pass (`hybrid.enable_predict=False`, a confidence threshold never reached)
  is marked "not exercised" with its predicted steps per run, in its cells and its verdict line; 1% of
  the steps predicted is enough; an arm that never predicts by design (outer momentum, selective
  backprop: `predicts` False) is not judged; a jump arm stays judged on its jumps."""
  assert figures.MIN_PREDICTED_FRACTION == 0.01
  curves = {a: ANCHOR for a in figures.ANCHORS}

  def arm(backward_passes: list[int], predicts: bool, jumps: list[int] | None = None) -> dict:
    runs = _equal_control()
    for i, r in enumerate(runs.values()):
      r.update(backward_passes=backward_passes[i], step_kinds={"full_step": backward_passes[i]})
      if jumps is not None:
        r.update(jumps=jumps[i], method_stats=["jumps"])
    return figures.method_figures(curves, runs, None, BUDGETS, eval_se=0.0418, predicts=predicts)

  never, once, by_design, jumping = (
    arm([40, 40], True),
    arm([40, 39], True),
    arm([40, 40], False),
    arm([30, 30], True, [4, 4]),
  )
  assert never["exercise"] == {"predicted_steps_per_run": 0.0, "minimum": 0.4, "exercised": False}
  assert once["exercise"] == {"predicted_steps_per_run": 0.5, "minimum": 0.4, "exercised": True}
  assert "exercise" not in by_design
  assert jumping["exercise"] == {"jumps_per_run": 4.0, "minimum": 3, "exercised": True}
  assert cells.exercise_mark(never) == "not exercised (0.0 predicted steps per run)"
  assert cells.exercise_mark(once) == cells.exercise_mark(by_design) == cells.exercise_mark(jumping) == ""
  assert cells.with_exercise("+0.00% (no difference)", never) == (
    "+0.00% (no difference); not exercised (0.0 predicted steps per run)"
  )
  lines = family_report.family_verdicts({"figures": {"never": never, "once": once, "by_design": by_design}})[2:]
  assert lines[0].startswith(
    "* `never`: **no difference** (not exercised (0.0 predicted steps per run): the comparison tested nothing "
    "of its predictions; pass ratio"
  )
  for line in lines[1:]:
    assert "exercised" not in line and "tested nothing" not in line


def test_an_arm_whose_predictions_were_discarded_reads_discarded_not_unexercised():
  """A predicting arm whose runs predicted and had every predicted step discarded by the framework (a
  non-finite move: `hybrid.step.keep_if_finite`) reads 'predictions discarded', with the steps discarded and
  kept per run, in its cells and its verdict line: it tried, and nothing it predicted stayed. The count is
  the run record's `predicted_steps_discarded` where it records it, else the steps that left their batch
  and so advanced no schedule step (a step beyond the schedule's, `phase_steps` over `steps`)."""
  curves = {a: ANCHOR for a in figures.ANCHORS}

  def arm(extra: dict) -> dict:
    runs = _equal_control()
    for r in runs.values():
      r.update(step_kinds={"full_step": 40, "predict_step": 2}, **extra)
    return figures.method_figures(curves, runs, None, BUDGETS, eval_se=0.0418, predicts=True)

  beyond = arm({"phase_steps": {"FULL": 38, "PREDICT": 2, "CORRECT": 2}})  # 42 steps for a schedule of 40
  recorded = arm({"predicted_steps_discarded": 2})
  for f in (beyond, recorded):
    assert f["exercise"] == {"predicted_steps_per_run": 0.0, "minimum": 0.4, "exercised": False, "discarded_per_run": 2}
    assert cells.exercise_mark(f) == "predictions discarded (2.0 per run discarded, 0.0 kept)"
  line = family_report.family_verdicts({"figures": {"nan": beyond}})[2]
  assert "predictions discarded (2.0 per run discarded, 0.0 kept): the comparison tested nothing" in line
  # A run that took no step beyond its schedule keeps the old words.
  assert cells.exercise_mark(arm({"phase_steps": {"FULL": 40}})) == "not exercised (0.0 predicted steps per run)"


def test_a_published_family_marks_a_velocity_arm_whose_runs_never_predicted():
  """The published long-adamw-cosine record with its velocity arm's runs made to predict nothing (every
  step a backward pass, as `--config.hybrid.enable_predict=False` would give): re-read, that arm and only
  that arm is marked in every table and its verdict; the record as published marks no velocity arm (its
  runs predicted about 320 of 3000 steps)."""
  from hybridjax.bench.studies.family import figures as family_figs

  with open(os.path.join(ROOT, "docs", "results", "long-adamw-cosine", "benchmark.json")) as f:
    stored = json.load(f)
  published = family_figs.family_figures(stored)["figures"]
  assert published["hybrid"]["exercise"]["exercised"] and published["velocity_control"]["exercise"]["exercised"]
  assert published["hybrid"]["exercise"]["predicted_steps_per_run"] > 300
  for m in ("outer_momentum", "selective", "selective_control"):  # never predict by design: not judged
    assert "exercise" not in published[m], m
  for r in stored["method_runs"]["hybrid"].values():
    r["backward_passes"] = r["steps"]
  result = stored | family_figs.family_figures(stored)
  assert result["figures"]["hybrid"]["exercise"] == {
    "predicted_steps_per_run": 0.0,
    "minimum": 30.0,
    "exercised": False,
  }
  md = family_report.markdown(result)
  mark = "not exercised (0.0 predicted steps per run)"
  rows = [line.split(" | ") for line in md.splitlines() if mark in line and line.startswith("| final loss")]
  assert len(rows) == 3  # vs each anchor at N and vs the control arm: in the hybrid arm's column, the second
  assert all(row[2].endswith(f"; {mark}") and sum(mark in cell for cell in row) == 1 for row in rows)
  verdicts = [line for line in md.splitlines() if line.startswith("* `") and "predicted steps per run" in line]
  assert len(verdicts) == 1 and verdicts[0].startswith("* `hybrid`: **")
  assert f"({mark}: the comparison tested nothing of its predictions; pass ratio" in verdicts[0]


def test_an_arm_without_its_control_says_so_in_its_verdict_line():
  from experiments.configs import benchmark as benchmark_cfg

  curves = {a: ANCHOR for a in figures.ANCHORS}
  f = figures.method_figures(curves, _equal_control(), None, BUDGETS, eval_se=0.0418)
  c = benchmark_cfg.get_config("quick")
  c.benchmark.arms.jump50 = {"method": "jump", "overrides": {"hybrid": {"jump": {"every": 50}}}}
  config = json.loads(c.to_json())
  result = {"config": config, "figures": {"jump50": f, "outer_momentum": f}}
  jump50, outer = family_report.family_verdicts(result)[2:]
  assert jump50.endswith(
    "; no control arm ran (method 'jump' declares one: add an arm with control=True and control_of='jump50', "
    "or name the method's module in --config.benchmark.methods)"
  ), jump50
  assert "control" not in outer.split("**")[-1]  # outer momentum declares none: the anchors are its control
  # With its control's comparison, the line reads it instead.
  result["figures"]["jump50"] = dict(f, vs_skip_control={**f["averaged_baseline"]["paired_difference"], "control": "c"})
  assert "; vs its control c: " in family_report.family_verdicts(result)[2]
