"""The figures, pure functions of the runs' results (the tests and scripts/results_table.py recompute
them): every arm against both anchors, per seed and summarised; the anchors' own phenomena; the
headline.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

from hybridjax.bench import protocol
from hybridjax.bench.studies import Record

ANCHORS = ("baseline", "averaged_baseline")  # the raw and the averaged budget curve
FORWARD_COST = 1.0 / 3.0  # a forward pass as a fraction of a training step (forward + backward)
# An arm whose headline runs took fewer accepted jumps than this per run (their mean) is "not
# exercised": with one or two jumps in a run of thousands of steps its loss is its control's up to
# noise, so a "no difference" it reads says nothing about jumping. Judged on the runs' `jumps` stat
# (the jump predictor's `method_summary`).
MIN_JUMPS_PER_RUN = 3
# Any other arm that is meant to predict (`arms.predicts`: a hybrid arm whose method has a
# `predict_step`) is "not exercised" where its headline runs predicted fewer than this fraction of their
# steps (the mean over the runs of steps - backward_passes, the steps taken without a backward pass):
# a velocity arm that never left its real steps (`hybrid.enable_predict=False`, a confidence threshold
# it never reaches) trains the baseline, and its comparisons test nothing of the method. The published
# velocity arms predicted about 1 step in 10.
MIN_PREDICTED_FRACTION = 0.01


def exercise(runs: Sequence[Record], predicts: bool = False) -> Record | None:
  """Whether an arm was exercised, from its headline runs. Where they record the jump predictor's
  accepted `jumps`: {'jumps_per_run': the mean over the runs that record it, 'minimum':
  MIN_JUMPS_PER_RUN, 'exercised': mean >= minimum}. Else, for an arm that `predicts` (`arms.predicts`):
  {'predicted_steps_per_run': the mean of steps - backward_passes, 'minimum': MIN_PREDICTED_FRACTION
  of the runs' mean steps, 'exercised': mean >= minimum}. None for any other arm (one that never predicts
  by design, outer momentum or selective backprop, is not judged)."""
  jumps = [r["jumps"] for r in runs if r.get("jumps") is not None]
  if jumps:
    per_run = float(statistics.fmean(jumps))
    return {"jumps_per_run": per_run, "minimum": MIN_JUMPS_PER_RUN, "exercised": per_run >= MIN_JUMPS_PER_RUN}
  counted = [r for r in runs if r.get("steps") is not None and r.get("backward_passes") is not None]
  if not predicts or not counted:
    return None
  per_run = float(statistics.fmean(r["steps"] - r["backward_passes"] for r in counted))
  minimum = MIN_PREDICTED_FRACTION * float(statistics.fmean(r["steps"] for r in counted))
  # The predicted steps the framework discarded (`hybrid.step.keep_if_finite`): where a run does not record
  # them, those that left their batch, each a step beyond the schedule's (`phase_steps` over `steps`).
  gone = [
    r.get("predicted_steps_discarded", max(sum(r.get("phase_steps", {}).values()) - r["steps"], 0)) for r in counted
  ]
  out = {"predicted_steps_per_run": per_run, "minimum": minimum, "exercised": per_run >= minimum}
  return out | ({"discarded_per_run": statistics.fmean(gone)} if any(gone) else {})


def method_figures(
  curves: Record,
  runs: Record,
  timing: Record | None,
  budgets: list[int],
  eval_se: float | None = None,
  predicts: bool = False,
  eval_windows: int | None = None,
) -> Record:
  """Every figure of one method arm against both anchors, per seed and summarised (pure: the tests
  recompute it). `eval_se`: the paired per-batch standard error (`eval_paired_se`) that every paired
  difference and the verdict are judged with, besides the seeds' (None: the seeds' alone), estimated over
  `eval_windows` eval batches (its df, `protocol.verdict`). `predicts`:
  the arm is meant to predict steps (`arms.predicts`), so runs that predicted none mark it not
  exercised (`exercise`)."""
  seeds = sorted(runs, key=int)
  rows = [runs[s] for s in seeds]
  n = rows[0]["steps"] if rows else None
  final = [r["final_loss"] for r in rows]
  out: Record = {"seeds": seeds}
  timing = timing or {}
  base_ms, method_ms, rounds = (
    timing.get("baseline", {}).get("baseline"),
    timing.get("method"),
    timing.get("rounds") or {},
  )
  base_rounds = round_times({"baseline": base_ms} if base_ms is not None else None, rounds.get("baseline"))
  method_rounds = round_times(method_ms, rounds.get("method"))
  for anchor in ANCHORS:
    anchor_curves = [curves[anchor][s] for s in seeds]
    reaches = [protocol.steps_to_reach_at_n(budgets, c, r["final_loss"], n) for c, r in zip(anchor_curves, rows)]
    summaries, per = seed_ratios(reaches, rows, base_ms, method_ms, base_rounds, method_rounds, True)
    at_n = [c[budgets.index(r["steps"])] for c, r in zip(anchor_curves, rows)]  # the anchor at the method's budget
    passes = [r["method_cost"] for r in per["pass_ratio"]]
    out[anchor] = {
      **summaries,
      "per_seed": per,
      "final_loss_gap": {
        **dict(zip(("mean", "std"), protocol.mean_std([(m - a) / a for m, a in zip(final, at_n)]))),
        "anchor_final_loss": at_n,
        "method_final_loss": final,
      },
      "paired_difference": protocol.paired_difference(final, at_n, eval_se, eval_windows=eval_windows)
      if len(seeds) >= 2
      else None,
      # Whether the pass ratio pays, judged in loss at the arm's passes as the anchor reads itself at N.
      "verdict": protocol.cost_verdict(
        final, passes, [(budgets, c) for c in anchor_curves], n, eval_se, eval_windows=eval_windows
      )
      if seeds
      else None,
    }
  for key in ("final_loss", "final_loss_raw", "backward_passes", "validation_forwards"):  # mean, std over the seeds
    out[key] = protocol.mean_std([r["final_raw" if key == "final_loss_raw" else key] for r in rows])
  # The method's own summary figures (`method_stats` of each run: e.g. accepted jumps), mean and std
  # over the seeds that have a value.
  stats = rows[0].get("method_stats", []) if rows else []
  for k in stats:
    values = [r[k] for r in rows if r.get(k) is not None]
    out[k] = protocol.mean_std(values) if values else None
  if stats:
    out["method_stats"] = list(stats)
  exercised = exercise(rows, predicts)
  if exercised is not None:
    out["exercise"] = exercised
  return out


Rounds = list[dict[str, float]] | None  # each timing round's ms per step kind (`round_times`), if recorded


def seed_ratios(
  reaches: Sequence[protocol.Reach],
  runs: Sequence[Record],
  base_ms: float | None,
  arm_ms: dict[str, float] | None,
  base_rounds: Rounds,
  arm_rounds: Rounds,
  baseline_ms: bool = False,
) -> tuple[Record, Record]:
  """(summaries, per seed) of an arm's backward, pass and wall-clock ratios, each run in `runs` against the
  anchor's steps to reach its loss (`reaches`), at the baseline's `base_ms` per step and the arm's `arm_ms`
  per step kind; the wall-clock ratio given its spread over the timing rounds (`base_rounds`, `arm_rounds`:
  `round_times`). `baseline_ms`: a family's shape, each wall-clock entry with the anchor's ms, and one
  without timing its anchor's steps alone; else a ladder's."""
  per: dict[str, list[Record]] = {"backward_ratio": [], "pass_ratio": [], "wallclock_ratio": []}
  for reach, r in zip(reaches, runs):
    per["backward_ratio"].append(protocol.ratio(reach, r["backward_passes"]))
    per["pass_ratio"].append(protocol.ratio(reach, r["backward_passes"] + FORWARD_COST * r["validation_forwards"]))
    wall = run_ms(r["step_kinds"], arm_ms)
    if baseline_ms and (base_ms is None or wall is None):
      per["wallclock_ratio"].append({"value": None, "lower_bound": False, "baseline_steps": reach.steps})
      continue
    value = None if wall is None or base_ms is None or reach.steps is None else reach.steps * base_ms / wall
    w = {"value": value, "lower_bound": reach.lower_bound, "upper_bound": reach.upper_bound}
    if baseline_ms:
      w["baseline_ms"] = None if reach.steps is None else reach.steps * base_ms
    rounds = round_ratios(reach.steps, base_rounds, r["step_kinds"], arm_rounds)  # the ratio round by round
    per["wallclock_ratio"].append(w | {"method_ms": wall} | ({} if rounds is None else {"rounds": rounds}))
  summaries = {k: protocol.summarize(v) for k, v in per.items()}
  with_spread(summaries["wallclock_ratio"], round_spread([x.get("rounds") for x in per["wallclock_ratio"]]))
  return summaries, per


def control_comparison(
  figures: Record,
  runs: dict[str, Record],
  controls: dict[str, str],
  eval_se: float | None = None,
  eval_windows: int | None = None,
) -> None:
  """Adds to every arm's figures its paired final-loss difference from its control arm (`controls`:
  arm -> its control; the same decisions without the effect, e.g. the jump's skip control, which
  advances the schedule without moving a weight), when that control ran: a method is credited only
  with what it adds to its control. Stored as `vs_skip_control`, the name the published results use;
  judged with `eval_se` (the paired per-batch standard error, over `eval_windows` batches) besides the seeds'."""
  for m, f in figures.items():
    control = controls.get(m)
    if control not in runs:  # none, or one that did not run
      continue
    skip = runs[control]
    seeds = [s for s in sorted(runs[m], key=int) if s in skip]
    if len(seeds) >= 2:
      f["vs_skip_control"] = protocol.paired_difference(
        [runs[m][s]["final_loss"] for s in seeds],
        [skip[s]["final_loss"] for s in seeds],
        eval_se,
        eval_windows=eval_windows,
      ) | {"control": control}


def run_ms(kinds: dict[str, int], ms: dict[str, float] | None) -> float | None:
  """A run's training time from its step counts by kind and the median time of each kind."""
  if ms is None or any(k not in ms for k in kinds):
    return None
  return sum(count * ms[k] for k, count in kinds.items())


def round_times(ms: dict[str, float] | None, rounds: dict[str, list[float | None]] | None) -> Rounds:
  """Each timing round's ms per step kind (`timing`'s `rounds_ms` of one arm): the round's own median of
  each kind of `ms` (the medians over every round), or the kind's median over every round where it did
  not run in that round (a rare kind: a jump arm's CORRECT step). None where no per-round times were
  recorded (a record from before they were kept)."""
  rounds = {k: v for k, v in (rounds or {}).items() if v}
  if ms is None or not rounds:
    return None
  count = max(len(v) for v in rounds.values())
  return [
    {k: v if k not in rounds or r >= len(rounds[k]) or rounds[k][r] is None else rounds[k][r] for k, v in ms.items()}
    for r in range(count)
  ]


def round_ratios(
  steps: float | None,
  base_rounds: Rounds,
  kinds: dict[str, int],
  method_rounds: Rounds,
) -> list[float] | None:
  """One run's wall-clock ratio computed round by round (`round_times`): the anchor's `steps` at each
  round's baseline ms over the run's step `kinds` at the same round's ms. None where either side has
  no per-round times, or the ratio has no value (a diverged run)."""
  if steps is None or base_rounds is None or method_rounds is None or len(base_rounds) != len(method_rounds):
    return None
  walls = [run_ms(kinds, ms) for ms in method_rounds]
  if any(w is None for w in walls):
    return None
  return [steps * b["baseline"] / w for b, w in zip(base_rounds, walls)]


def round_spread(per_seed: Sequence[Sequence[float] | None]) -> Record | None:
  """The spread over the timing rounds of a wall-clock ratio's mean over the seeds: per round, the mean
  over the seeds of each seed's ratio computed with that round's times alone (`round_ratios`); their
  quartiles (inclusive) and interquartile range. The ratio itself is read from the medians over every
  round. None where no per-round times were recorded (a record from before they were kept) or no seed
  has a ratio."""
  present = [list(x) for x in per_seed if x is not None]
  if not present:
    return None
  means = [float(np.mean(values)) for values in zip(*present)]
  q1, q3 = (means[0], means[0]) if len(means) < 2 else statistics.quantiles(means, n=4, method="inclusive")[::2]
  return {"q1": q1, "q3": q3, "iqr": q3 - q1, "rounds": len(means), "per_round": means}


def with_spread(ratio: Record, spread: Record | None) -> Record:
  """`ratio` (a wall-clock ratio's summary) given its `spread` (`round_spread`) where it has one; a ratio
  without per-round times stays as a record from before they were kept holds it (no `spread`)."""
  if spread is not None:
    ratio["spread"] = spread
  return ratio


def anchor_figures(
  curves: Record, budgets: list[int], n: int, eval_se: float | None = None, eval_windows: int | None = None
) -> Record:
  """The anchors themselves: final losses at N (the averaged against the raw judged with `eval_se`, over
  `eval_windows` batches), and the averaging anchor's lead over the raw one in steps (baseline steps
  needed to reach the averaged loss at N, per seed; a lower or an upper bound where the averaged loss
  lies below or above the raw curve)."""
  seeds = sorted(curves["baseline"], key=int)
  i = budgets.index(n)
  raw, avg = ([curves[a][s][i] for s in seeds] for a in ANCHORS)
  lead = [protocol.steps_to_reach(budgets, curves["baseline"][s], a) for s, a in zip(seeds, avg)]
  return {
    "final_loss": {"baseline": protocol.mean_std(raw), "averaged_baseline": protocol.mean_std(avg)},
    "averaging_vs_raw": protocol.paired_difference(avg, raw, eval_se, eval_windows=eval_windows)
    if len(seeds) >= 2
    else None,
    "averaging_lead_steps": {
      "per_seed": [None if r.steps is None else r.steps - n for r in lead],
      "lower_bound": [r.lower_bound for r in lead],
      "upper_bound": [r.upper_bound for r in lead],
    },
  }


def phenomena(curves: Record, budget_runs: Record, budgets: list[int], n: int) -> Record:
  """The two facts a preset must show for its figures to mean anything.

  * Mid-run, the averaged params are worth many steps of the raw run: at the eval point nearest N/2
    of each headline seed's N-step run, how many steps later the raw iterate of the same run first
    reaches the averaged params' loss (linear interpolation between eval points).
  * A 25% larger budget lowers the final loss beyond the paired seed noise (both anchors).
  """
  seeds = sorted(curves["baseline"], key=int)
  worth = []
  for s in seeds:
    curve = budget_runs[f"{s}/{n}"]["curve"]
    mid = min(curve, key=lambda p: abs(p["step"] - n / 2))
    target, steps = mid["eval_loss_averaged"], None
    for a, b in zip(curve, curve[1:]):
      if b["step"] <= mid["step"]:
        continue
      if b["eval_loss_raw"] <= target:
        lo, hi = a["eval_loss_raw"], b["eval_loss_raw"]
        frac = 1.0 if lo == hi else min(max((lo - target) / (lo - hi), 0.0), 1.0)
        at = a["step"] + frac * (b["step"] - a["step"]) if lo > target else a["step"]
        steps = at - mid["step"]
        break
    worth.append({"seed": s, "at_step": mid["step"], "steps": steps, "reached": steps is not None})
  out: Record = {"averaging_worth_mid_run": worth}
  f125 = round(1.25 * n)
  if f125 in budgets and len(seeds) >= 2:
    i, j = budgets.index(n), budgets.index(f125)
    # The eval set's own sampling error of that gain: the same eval batches score both runs, so it
    # is the standard error of the per-batch difference (averaged params), per seed; None where it
    # cannot be estimated (one eval batch).
    pairs = [(budget_runs[f"{s}/{f125}"], budget_runs[f"{s}/{n}"]) for s in seeds]  # (1.25N's run, N's) per seed
    ses = [
      paired_batch_se_of(a, b) for a, b in pairs if "final_averaged_per_batch" in a and "final_averaged_per_batch" in b
    ]
    eval_se = _mean_or_none(ses)
    batches = len(pairs[0][1].get("final_averaged_per_batch") or []) or None
    out["budget_1.25N_vs_N"] = {}
    for a in ANCHORS:
      longer, at_n = [curves[a][s][j] for s in seeds], [curves[a][s][i] for s in seeds]
      # The averaged anchor's own runs kept their windows: its gain is judged with their error.
      own = window_error(*zip(*pairs), [x - y for x, y in zip(longer, at_n)]) if a == "averaged_baseline" else None
      se, windows = own if own is not None else (eval_se, batches)
      out["budget_1.25N_vs_N"][a] = protocol.paired_difference(longer, at_n, se, eval_windows=windows)
    out["eval_sampling_se_of_the_1.25N_gain"] = ses
  return out


def _mean_or_none(xs: list[float | None]) -> float | None:
  """The mean of `xs`, or None when it is empty or any value is None (an error that cannot be estimated)."""
  return None if not xs or any(x is None for x in xs) else float(np.mean(xs))


def paired_batch_se_of(a: Record, b: Record) -> float | None:
  """The paired per-batch standard error of two anchor runs' final averaged losses (the same eval
  batches score both: `protocol.paired_batch_se`), or None where it cannot be estimated (one eval
  batch, or a run that kept no per-batch losses)."""
  if "final_averaged_per_batch" not in a or "final_averaged_per_batch" not in b:
    return None
  return protocol.paired_batch_se(a["final_averaged_per_batch"], b["final_averaged_per_batch"])


def window_error(a: Sequence[Record], b: Sequence[Record], differences: Sequence[float]) -> tuple[float, int] | None:
  """(the eval windows' standard error of the seed-averaged difference a - b, the windows), from each seed's
  runs of the two settings (a[i], b[i]: their averaged iterates' per-window losses, `final_averaged_per_batch`),
  where every run kept them and their means give the per-seed `differences` (to float32 rounding: the
  windows are those of the losses compared). `protocol.seed_averaged_window_se`: the windows' own error of
  this difference, not the study's error of two runs at N. None where they are not stored or give other
  losses (a side read raw, or at another beta): the study's error then judges."""
  if not a or len(a) != len(b) or any("final_averaged_per_batch" not in r for r in [*a, *b]):
    return None
  x = np.asarray([r["final_averaged_per_batch"] for r in a], dtype=np.float64)
  y = np.asarray([r["final_averaged_per_batch"] for r in b], dtype=np.float64)
  if x.shape != y.shape or x.ndim != 2 or x.shape[1] < 2:
    return None
  if not np.allclose((x - y).mean(axis=1), differences, rtol=0, atol=1e-5):
    return None
  return protocol.seed_averaged_window_se(x, y), int(x.shape[1])


def eval_errors(budget_runs: Record, seeds: list[str], budgets: list[int], n: int) -> Record:
  """benchmark.json's `eval` record: the eval batches, one averaged loss's sampling error (the first
  headline seed's N-step run) and the eval set's paired sampling error of a difference of two runs at N,
  which every verdict is judged with: per headline seed, the per-batch standard error
  (`protocol.paired_batch_se`) of the difference of the averaged params' losses of the N-step run and the
  next budget's (1.25N by default; the one below N where N is the largest), scored on the same batches.

  Every paired difference of a study is judged with its mean over the seeds, beside the seeds' own
  standard error. It stands for any two runs at N: a method's runs keep no per-batch losses.

  Returns:
    {"paired_se": the mean over the seeds, or None where it cannot be estimated (fewer than 2 eval
    batches, or a run that kept no per-batch losses), "per_seed", "budgets": the pair, "batches",
    "sampling_se": None where it cannot be estimated (one eval batch)}.
  """
  first = budget_runs[f"{seeds[0]}/{n}"]
  batches = int(first["eval_batches"])
  out = {"batches": batches, "sampling_se": first["eval_batch_std"] / math.sqrt(batches) if batches > 1 else None}
  others = [b for b in budgets if b > n] or [b for b in budgets if b < n][-1:]
  if not others:
    return {"paired_se": None, "per_seed": [None for _ in seeds], "budgets": [n]} | out
  other = min(others, key=lambda b: abs(math.log(b / n)))
  per_seed = [paired_batch_se_of(budget_runs.get(f"{s}/{n}", {}), budget_runs.get(f"{s}/{other}", {})) for s in seeds]
  return {"paired_se": _mean_or_none(per_seed), "per_seed": per_seed, "budgets": [n, other]} | out


def headline(result: Record, method: str | None) -> Record:
  """The compact summary (`headline.json`) of one family's protocol and its main method arm."""
  tuning, anchors = result["tuning"], result["anchor_figures"]
  h: Record = {
    "preset": result["preset"],
    "family": result["family"],
    "method": method,
    "tuning_seeds": result["tuning_seeds"],
    "seeds": result["seeds"],
    "steps": result["steps"],
    "lr_sweep": {
      str(r["lr"]): r["loss_averaged"]
      for r in tuning["rows"]
      if r["seed"] == result["tuning_seeds"][0] and r["budget"] == result["steps"]
    },
    "best_lr": tuning["best_lr"],
    "averaging_beta": tuning["averaging_beta"],
    "budgets": result["budgets"],
    "averaging_lead_steps": anchors["averaging_lead_steps"]["per_seed"],
  }
  final = {a: anchors["final_loss"][a] for a in ANCHORS}
  if method is not None:
    f = result["figures"][method]
    vs = lambda read: {f"vs_{a}": read(f[a]) for a in ANCHORS}  # one reading against each anchor
    for key in ("backward_ratio", "pass_ratio", "wallclock_ratio"):
      h[key] = vs(lambda x: x[key]["mean"])
      h[key + "_std"] = vs(lambda x: x[key]["std"])
      h[key + "_null_or_bound"] = vs(lambda x: [x[key]["n_null"], x[key]["n_lower_bound"], x[key]["n_upper_bound"]])
    spreads = {f"vs_{a}": f[a]["wallclock_ratio"]["spread"] for a in ANCHORS if "spread" in f[a]["wallclock_ratio"]}
    if spreads:  # the wall-clock ratio's spread over the timing rounds (`round_spread`), where recorded
      h["wallclock_ratio_spread"] = spreads
    h["final_loss_gap"] = vs(lambda x: x["final_loss_gap"]["mean"])
    h["paired_difference"] = vs(lambda x: x["paired_difference"]["verdict"])
    h["verdict"] = vs(lambda x: x["verdict"]["verdict"])
    # its control's difference; whether it jumped or predicted enough
    h |= {key: f[key] for key in ("vs_skip_control", "exercise") if key in f}
    final["method"] = f["final_loss"]
  h["final_loss"] = final
  return h


def eval_loss_near(curve: Sequence[Record], step: float) -> tuple[int, float] | None:
  """(step, raw eval loss) of the eval point of `curve` nearest `step`, or None when none lies within
  half an eval interval of it."""
  if not curve:
    return None
  steps = [p["step"] for p in curve]
  interval = min(b - a for a, b in zip([0] + steps, steps))
  p = min(curve, key=lambda p: abs(p["step"] - step))
  return (p["step"], p["eval_loss_raw"]) if abs(p["step"] - step) <= interval / 2 else None


def plateau_runs(
  curves: dict[str, dict[str, Sequence[Record]]], n: int, margin: float, min_seeds: int = 3
) -> list[Record]:
  """The runs that sit on an early plateau. `curves`: {label: {seed: eval curve}}, the runs of one
  setting per label. A run is flagged whose raw eval loss at N/10 or at N (the eval point nearest
  there) is more than `margin` (relative) above the median of its label's runs over the seeds, or
  not finite. Comparing a run with its own setting's other seeds flags a seed that fell behind, never
  a setting that is simply worse; a label with fewer than `min_seeds` seeds read is not judged (a
  search's two-seed settings pass 2: the median of two is their mean, so only the higher can be
  flagged)."""
  flagged = []
  for label, per_seed in curves.items():
    for point in (n / 10, n):
      read = {s: eval_loss_near(c, point) for s, c in per_seed.items()}
      present = [v for v in read.values() if v is not None and math.isfinite(v[1])]
      if len(present) < min_seeds:
        continue
      median = statistics.median(v[1] for v in present)
      for s, v in read.items():
        if v is not None and (not math.isfinite(v[1]) or v[1] > median * (1 + margin)):
          flagged.append({"run": label, "seed": s, "at_step": v[0], "loss": v[1], "median_over_seeds": median})
  return flagged
