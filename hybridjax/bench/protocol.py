"""The benchmark protocol: from benchmark runs to the figures we report (docs/benchmark.md, "Figures").

Pure numpy and scipy; nothing here imports jax or the rest of hybridjax but `stats` (Satterthwaite's df).

A baseline's budget curve is made monotone (`monotone_envelope`); a method's final loss is read on it
as the baseline steps to reach it (`steps_to_reach`, interpolated in log(budget) between the
envelope's drops, `reading_knots`; reached, a lower or an upper bound, or not reached), divided by
the method's cost (`ratio`; `curve_loss_at` is the inverse reading). Per-seed ratios are aggregated
(`summarize`, `mean_std`); two settings on the same seeds are compared (`paired_difference`, with
the eval set's paired per-batch error, `paired_batch_se`) and judged as the anchor reads itself at N
(`cost_verdict`); every verdict word comes from one rule (`verdict`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import scipy.stats

from hybridjax.bench import stats
from hybridjax.bench.studies import Record

Floats = Sequence[float] | np.ndarray  # one value per budget, or per seed


def _finite(*xs: np.ndarray) -> bool:
  return all(np.all(np.isfinite(x)) for x in xs)


def _paired(a: Floats, b: Floats, unit: str, why: str) -> tuple[np.ndarray, np.ndarray]:
  """`a` and `b` as flat float arrays of one length (else a ValueError counting their `unit`, `why`)."""
  x, y = (np.asarray(v, dtype=np.float64).ravel() for v in (a, b))
  if x.size != y.size:
    raise ValueError(f"mismatched lengths: {x.size} {unit} in a but {y.size} in b ({why})")
  return x, y


def _curve(budgets: Floats, losses: Floats) -> tuple[np.ndarray, np.ndarray]:
  """Validated (budgets, losses) as 1-D float arrays, in the order given."""
  b, loss = (np.asarray(v, dtype=np.float64) for v in (budgets, losses))
  if b.ndim != 1 or loss.ndim != 1:
    raise ValueError(f"budgets and losses must be 1-D, got shapes {b.shape} and {loss.shape}")
  if b.size == 0:
    raise ValueError("empty curve: at least one (budget, loss) point is needed")
  if b.size != loss.size:
    raise ValueError(f"mismatched lengths: {b.size} budgets but {loss.size} losses")
  if not _finite(b):
    raise ValueError(f"budgets must be finite, got {b.tolist()}")
  if np.any(b <= 0):
    raise ValueError(f"budgets must be positive (steps), got {b.tolist()}")
  values, counts = np.unique(b, return_counts=True)
  if np.any(counts > 1):
    raise ValueError(f"duplicate budgets: {values[counts > 1].tolist()}")
  if not _finite(loss):
    raise ValueError(f"losses must be finite, got {loss.tolist()}")
  return b, loss


def monotone_envelope(budgets: Floats, losses: Floats) -> tuple[np.ndarray, np.ndarray]:
  """The baseline curve sorted by budget, with the running minimum of its losses.

  A baseline given more steps is credited with the best loss of any smaller budget, so the returned curve is
  non-increasing and never above the input at the same budget.

  Args:
    budgets: step budgets of the baseline runs (positive, distinct, any order).
    losses: the final eval loss of each run (finite).

  Returns:
    (budgets sorted ascending, running minimum of the losses in that order), both float64 arrays.

  Raises:
    ValueError: on an empty curve, mismatched lengths, non-positive or non-finite budgets, duplicate
      budgets, or non-finite losses.
  """
  b, loss = _curve(budgets, losses)
  order = np.argsort(b, kind="stable")
  return b[order], np.minimum.accumulate(loss[order])


def reading_knots(budgets: Floats, losses: Floats) -> tuple[np.ndarray, np.ndarray, float]:
  """The points the baseline curve is read between: the envelope's first budget and every budget at which
  the envelope drops (a new best loss, by more than float rounding: `rounding`), with the largest budget.

  A flat stretch of the envelope (budgets that did no better than a smaller one, up to float rounding) has
  no point of its own: the curve runs from the stretch's first budget straight to the next drop, linearly
  in log(budget), and is flat from the last drop to the largest budget. So the curve is continuous in the
  target: a loss a hair below a flat stretch reads its first budget, and further below, just after it,
  never the stretch's far end.

  Returns:
    (knot budgets ascending, their losses, strictly decreasing; the largest budget), float64.

  Raises:
    ValueError: on a bad curve (see `monotone_envelope`).
  """
  b, env = monotone_envelope(budgets, losses)
  drops, best = [0], env[0]
  for i in range(1, env.size):
    if env[i] + rounding(env[i]) < best - rounding(best):  # their rounding bands do not touch
      drops.append(i)
      best = env[i]
  return b[drops], env[drops], float(b[-1])


# Eval losses are float32 means: two that differ by less than this fraction of their size (8 to 17
# float32 ulps) are the same loss up to rounding. A knot's loss +- this is its rounding band: a target
# inside it reads the knot, and an envelope "drop" whose band touches the last knot's is a flat stretch.
ROUNDING = 1e-6


def rounding(loss: float) -> float:
  """The difference below which two losses near `loss` are equal up to float rounding."""
  return ROUNDING * abs(float(loss))


@dataclasses.dataclass(frozen=True)
class Reach:
  """Baseline steps needed to reach a loss.

  Attributes:
    steps: the steps, or None when not reached (the target is NaN or +inf: a diverged run).
    lower_bound: True when the target is below the end of the curve by more than float rounding: the
      baseline needs more than `steps` (the envelope's last drop: its largest budget, unless the budgets
      after the drop did no better).
    upper_bound: True when the target is above the start of the curve by more than float rounding: the
      baseline's smallest budget already does better, so it needs at most `steps` (its smallest budget).
  """

  steps: float | None
  lower_bound: bool
  upper_bound: bool = False


def steps_to_reach(budgets: Floats, losses: Floats, target: float) -> Reach:
  """Baseline steps needed to reach eval loss `target`, read off the curve between `reading_knots`.

  A target within float rounding of a knot's loss (its band, env_i +- `rounding`(env_i)) reads that knot's
  budget: a run equal to the baseline up to its last bits reads 1.00x, however little the curve drops
  after it. Between the bands of the knot b_i above the target and the next knot b_{i+1} below it, the
  steps are interpolated linearly in log(budget), from band edge to band edge (so continuously):
  log b = log b_i + (top_i - target) / (top_i - bottom_{i+1}) * (log b_{i+1} - log b_i),
  top_i = env_i - rounding(env_i), bottom_{i+1} = env_{i+1} + rounding(env_{i+1}).
  A flat stretch of the envelope is read from its first budget.

  Args:
    budgets: step budgets of the baseline runs.
    losses: their final eval losses.
    target: the eval loss to reach.

  Returns:
    `Reach(steps, False)` when reached (steps in [smallest budget, largest budget]; the first budget of the
    envelope's stretch at the target's loss up to rounding); `Reach(b, True)` when the target is below the
    end of the envelope by more than rounding (a lower bound: the baseline needs more than b, the
    envelope's last drop, which is the largest budget unless the budgets after it did no better, so a run
    a hair below a flat end reads its first budget, as on a flat stretch inside the curve);
    `Reach(smallest budget, False, True)` when the target is above the start of the envelope by more than
    rounding (an upper bound: the smallest budget already does better);
    `Reach(None, False)` when the target is NaN or +inf (a diverged run: not reached).

  Raises:
    ValueError: on a bad curve (see `monotone_envelope`).
  """
  kb, ke, last = reading_knots(budgets, losses)
  target = float(target)
  if math.isnan(target) or target == math.inf:
    return Reach(None, False)
  if target > ke[0] + rounding(ke[0]):
    return Reach(float(kb[0]), False, True)
  if target < ke[-1] - rounding(ke[-1]):
    return Reach(float(kb[-1]), True)
  band = ROUNDING * np.abs(ke)  # each knot's `rounding`
  j = int(np.argmax(ke - band <= target))  # the first knot whose band reaches down to the target
  if target <= ke[j] + band[j]:  # inside its band: its loss up to rounding
    return Reach(float(kb[j]), False)
  # j >= 1 here, and the target lies between knot j - 1's band and knot j's (disjoint: `reading_knots`).
  lo, hi = kb[j - 1], kb[j]
  top, bottom = ke[j - 1] - band[j - 1], ke[j] + band[j]
  frac = (top - target) / (top - bottom)
  steps = lo * math.exp(frac * math.log(hi / lo))
  return Reach(float(min(max(steps, lo), hi)), False)


def curve_loss_at(budgets: Floats, losses: Floats, steps: float) -> float | None:
  """The curve's loss at `steps` (between `reading_knots`, linearly in log(budget)): the inverse of
  `steps_to_reach` up to float rounding (`rounding`), never above the monotone envelope by more.

  Args:
    budgets: step budgets of the baseline runs.
    losses: their final eval losses.
    steps: where to read the curve.

  Returns:
    The loss, or None when `steps` is outside [smallest budget, largest budget] (or NaN).

  Raises:
    ValueError: on a bad curve (see `monotone_envelope`).
  """
  kb, ke, last = reading_knots(budgets, losses)
  steps = float(steps)
  if not (kb[0] <= steps <= last):
    return None
  if steps >= kb[-1]:
    return float(ke[-1])
  j = int(np.searchsorted(kb, steps, side="left"))
  if kb[j] == steps:
    return float(ke[j])
  lo, hi = kb[j - 1], kb[j]
  frac = math.log(steps / lo) / math.log(hi / lo)
  return float(ke[j - 1] + frac * (ke[j] - ke[j - 1]))


def ratio(reach: Reach, method_cost: float) -> Record:
  """The step ratio: baseline steps needed to reach the method's loss over the method's cost.

  Args:
    reach: from `steps_to_reach` at the method's loss.
    method_cost: the method's cost in baseline-step equivalents (> 0).

  Returns:
    {"value": reach.steps / method_cost, or None when not reached, "lower_bound": reach.lower_bound (the
    ratio is at least the value), "upper_bound": reach.upper_bound (the ratio is at most the value),
    "baseline_steps": reach.steps, "method_cost": method_cost}.

  Raises:
    ValueError: when method_cost is not a positive finite number.
  """
  cost = float(method_cost)
  if not (math.isfinite(cost) and cost > 0):
    raise ValueError(f"method_cost must be a positive finite number, got {method_cost!r}")
  return {
    "value": None if reach.steps is None else float(reach.steps) / cost,
    "lower_bound": bool(reach.lower_bound),
    "upper_bound": bool(reach.upper_bound),
    "baseline_steps": reach.steps,
    "method_cost": cost,
  }


def summarize(values: Sequence[Record]) -> Record:
  """Aggregates per-seed ratio dicts (from `ratio`).

  Bounds enter the mean at their value (a lower bound's is conservative; an upper bound's makes the mean an
  upper bound too where no seed is a lower bound); nulls are left out of the mean and std but counted.

  Args:
    values: one `ratio` dict per seed.

  Returns:
    {"mean": mean of the non-null values or None, "std": their sample std (ddof=1) or None with fewer than 2,
    "n": number of seeds, "n_null": number of None values, "n_lower_bound": number of lower bounds,
    "n_upper_bound": number of upper bounds, "values": the values in order}.
  """
  vals = [None if v["value"] is None else float(v["value"]) for v in values]
  present = [v for v in vals if v is not None]
  return {
    "mean": float(np.mean(present)) if present else None,
    "std": float(np.std(present, ddof=1)) if len(present) >= 2 else None,
    "n": len(vals),
    "n_null": len(vals) - len(present),
    "n_lower_bound": sum(1 for v in values if v["lower_bound"]),
    "n_upper_bound": sum(1 for v in values if v.get("upper_bound")),
    "values": vals,
  }


def mean_std(xs: Floats) -> list[float]:
  """[mean, sample std (ddof=1)] of `xs`; the std of a single value is 0.0.

  Raises:
    ValueError: when `xs` is empty.
  """
  x = np.asarray(xs, dtype=np.float64).ravel()
  if x.size == 0:
    raise ValueError("mean_std of an empty sequence")
  return [float(np.mean(x)), float(np.std(x, ddof=1)) if x.size > 1 else 0.0]


def paired_batch_se(a: Floats, b: Floats) -> float | None:
  """The eval set's sampling error of the difference of two runs' losses scored on the same batches: the
  standard error of the per-batch difference, std(a_j - b_j, ddof=1) / sqrt(batches).

  The batches' own difficulty is common to both runs and cancels, so this is the error a difference of two
  final losses carries, far smaller than one loss's sampling error (std(a_j) / sqrt(batches)).

  Args:
    a: one run's loss on each eval batch.
    b: the other run's, on the same batches in the same order.

  Returns:
    The standard error, or None when it cannot be estimated (fewer than 2 batches).

  Raises:
    ValueError: on mismatched lengths or non-finite values.
  """
  x, y = _paired(a, b, "batches", "the same batches score both")
  if not _finite(x, y):
    raise ValueError("per-batch losses must be finite")
  if x.size < 2:
    return None
  return float(np.std(x - y, ddof=1) / math.sqrt(x.size))


# The verdict rules (`verdict`). "t": Student's t at Satterthwaite's degrees of freedom, the rule every
# verdict is judged by (`RULE`). "2se": |mean| against 2 se_total, the rule every record published before
# "t" was judged by; a stored paired difference that names no "rule" was judged by it (`rule_of`), and
# docs/results/verdicts-reread.md lists each published verdict's word under both.
RULES = ("t", "2se")
RULE = "t"
UNMARKED_RULE = "2se"


def rule_of(difference: Record) -> str:
  """The rule a stored paired difference's verdict was judged by: the one it names, else `UNMARKED_RULE`
  (a record written before its differences named their rule)."""
  return str(difference.get("rule", UNMARKED_RULE))


def _check_se(name: str, se: float | None) -> None:
  if se is not None and not (math.isfinite(se) and se >= 0):
    raise ValueError(f"{name} must be a finite standard error >= 0 or None, got {se!r}")


def verdict(
  mean: float,
  se_seed: float,
  n: int,
  se_eval: float | None = None,
  eval_windows: int | None = None,
  rule: str = RULE,
) -> Record:
  """The verdict word of a paired mean difference (a - b), the one rule every study's words come from.

  se_total^2 = se_seed^2 + se_eval^2: the seeds' standard error (sd(d) / sqrt(n), on n - 1 df) and the eval
  windows' (the same windows score every seed, so their sampling error does not average out over the
  seeds; on eval_windows - 1 df, or infinite where the count is not known).

  * rule "t": df by Satterthwaite (`stats.satterthwaite_df`); "lower" (a below b) / "higher" where
    |mean| > t(0.975, df) se_total, else "no difference", with the two-sided p of mean / se_total.
  * rule "2se": "no difference" where |mean| < 2 se_total, else "lower" / "higher" (`UNMARKED_RULE`: to
    read a record as it was published).

  Either way, se_total == 0 reads "no difference" for a zero mean and "lower"/"higher" otherwise (p 1 or 0).

  Returns:
    {"verdict"}; under "t" also {"df", "t_crit", "p"} (df None where se_total is 0).

  Raises:
    ValueError: on an unknown rule, n < 2, or a negative or non-finite standard error.
  """
  if rule not in RULES:
    raise ValueError(f"verdict rule {rule!r}: give one of {RULES}")
  if n < 2:
    raise ValueError(f"a paired verdict needs at least 2 seeds, got {n}")
  _check_se("se_seed", se_seed)
  _check_se("se_eval", se_eval)
  total = math.hypot(se_seed, se_eval or 0.0)
  word = "lower" if mean < 0 else "higher"
  if rule == "2se":
    return {"verdict": "no difference" if abs(mean) < 2 * total or (total == 0 and mean == 0) else word}
  if total == 0:
    return {
      "verdict": "no difference" if mean == 0 else word,
      "df": None,
      "t_crit": None,
      "p": float(mean == 0),
    }
  eval_df = math.inf if eval_windows is None else float(eval_windows - 1)
  df = stats.satterthwaite_df([(se_seed, n - 1), (se_eval or 0.0, eval_df)])
  t_crit = float(scipy.stats.t.ppf(0.975, df))
  return {
    "verdict": word if abs(mean) > t_crit * total else "no difference",
    "df": df,
    "t_crit": t_crit,
    "p": float(2 * scipy.stats.t.sf(abs(mean) / total, df)),
  }


def seed_averaged_window_se(a: Sequence[Floats] | np.ndarray, b: Sequence[Floats] | np.ndarray) -> float:
  """The eval windows' standard error of a seed-averaged paired difference: per window j, the difference
  a_sj - b_sj averaged over the seeds s, then sd over the windows (ddof=1) / sqrt(windows).

  Args:
    a: (seeds, windows) one side's loss on each eval window, per seed.
    b: the other side's, the same seeds and windows in the same order.

  Raises:
    ValueError: on mismatched shapes, fewer than 2 windows or non-finite values.
  """
  x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  if x.shape != y.shape or x.ndim != 2:
    raise ValueError(f"per-window losses must be (seeds, windows) of one shape, got {x.shape} and {y.shape}")
  if x.shape[1] < 2:
    raise ValueError(f"the windows' error needs at least 2 windows, got {x.shape[1]}")
  if not _finite(x, y):
    raise ValueError("per-window losses must be finite")
  d = (x - y).mean(axis=0)
  return float(np.std(d, ddof=1) / math.sqrt(d.size))


def paired_difference(
  a: Floats,
  b: Floats,
  eval_se: float | None = None,
  rule: str = RULE,
  eval_windows: int | None = None,
) -> Record:
  """Per-seed differences a_i - b_i of two settings measured on the same seeds, judged by `verdict`.

  The mean difference is judged against the seeds' standard error and the eval set's: `eval_se`, the
  paired per-batch standard error of a difference of two runs (`paired_batch_se`; `seed_averaged_window_se`
  where both sides kept their per-window losses). The eval batches are the same for every seed, so their
  sampling error does not average out over the seeds; it enters whole: se_total = sqrt(se^2 + eval_se^2).
  Two runs equal up to float rounding then read "no difference" even where the rounding happens to have
  one sign on every seed.

  Args:
    a: one value per seed.
    b: one value per seed, in the same seed order.
    eval_se: the paired per-batch standard error, or None where it cannot be estimated (one eval batch)
      or was not recorded: the seeds' standard error alone judges.
    rule: the verdict rule (`RULES`; `RULE` unless a record is read as it was published).
    eval_windows: the eval windows eval_se was estimated over (its df: windows - 1; None: infinite df).

  Returns:
    {"mean", "std" (ddof=1), "se" (std / sqrt(n)), "eval_se", "se_total", "n", "differences", "verdict",
    "rule", "eval_windows"}; under rule "t" also "df", "t_crit", "p" (`verdict`).

  Raises:
    ValueError: on mismatched lengths, fewer than 2 pairs, non-finite values or a negative or non-finite
      eval_se.
  """
  x, y = _paired(a, b, "values", "pairs are per seed")
  if x.size < 2:
    raise ValueError(f"at least 2 pairs are needed, got {x.size}")
  if not _finite(x, y):
    raise ValueError(f"values must be finite, got a={x.tolist()} b={y.tolist()}")
  _check_se("eval_se", eval_se)
  d = x - y
  n = int(d.size)
  mean = float(np.mean(d))
  std = float(np.std(d, ddof=1))
  se = std / math.sqrt(n)
  judged = verdict(mean, se, n, eval_se, eval_windows, rule)
  return {
    "mean": mean,
    "std": std,
    "se": se,
    "eval_se": None if eval_se is None else float(eval_se),
    "se_total": math.hypot(se, eval_se or 0.0),
    "n": n,
    "differences": d.tolist(),
    "verdict": judged.pop("verdict"),
    "rule": rule,
    "eval_windows": eval_windows,
  } | judged


PAYS = {"lower": "pays", "higher": "does not pay", "no difference": "no difference"}


def anchor_at_n(steps: Floats, losses: Floats, n: float) -> tuple[float | None, float | None]:
  """(the anchor's own loss at N, the curve's loss at N): the measured point where the curve has one at N
  (else the curve's), and `curve_loss_at`. The first lies above the second where N is no drop of the
  anchor's envelope beyond float rounding (`reading_knots`): a smaller budget did as well or better, and
  the anchor reads below 1x against itself."""
  curve = curve_loss_at(steps, losses, n)
  own = float(losses[list(steps).index(n)]) if n in list(steps) else curve
  return own, curve


def steps_to_reach_at_n(budgets: Floats, losses: Floats, target: float, n: float) -> Reach:
  """`steps_to_reach` read as the anchor reads itself at N, as `cost_verdict` judges: where the anchor's
  own N-step loss lies above its envelope by more than float rounding (`anchor_at_n`: a smaller budget
  did as well or better), its own loss reads `steps_to_reach` r < N steps; every reading on that curve
  is then scaled by N / r, so the anchor's own loss (up to float rounding) reads N, and an arm equal to
  it reads 1.00x at N's cost instead of r / N, a ratio that would read like a loss. Elsewhere it is
  `steps_to_reach` itself."""
  reach = steps_to_reach(budgets, losses, target)
  if reach.steps is None or n not in list(budgets):
    return reach
  own, at_n = anchor_at_n(budgets, losses, n)
  if own is None or at_n is None or own - at_n <= rounding(at_n):
    return reach
  if abs(float(target) - own) <= rounding(own):  # the anchor's own N-step loss, up to rounding
    return Reach(float(n), False)
  scale = float(n) / float(steps_to_reach(budgets, losses, own).steps)
  return Reach(float(reach.steps) * scale, reach.lower_bound, reach.upper_bound)


def cost_verdict(
  losses: Floats,
  costs: Floats,
  curves: Sequence[tuple[Floats, Floats]],
  n: float,
  eval_se: float | None,
  eval_windows: int | None = None,
) -> Record:
  """Whether a method pays against an anchor: per seed, its loss against the anchor's curve at its cost,
  read as the anchor reads itself at N, then paired over the seeds (`paired_difference` against zero).

  The difference per seed is (loss - curve(cost)) - (anchor(N) - curve(N)): the second term, zero where
  the anchor's curve drops at N, is how far the anchor's own N-step loss lies above its curve. So a
  method equal to the anchor at N reads "no difference" on every seed, and one below the curve at its
  cost by more than the noise (seeds' and eval set's) "pays": its ratio is above the anchor's own.

  Args:
    losses: the method's loss per seed.
    costs: its cost per seed, in baseline steps (e.g. passes).
    curves: per seed, the anchor's (budgets, losses).
    n: the budget N (where the anchor reads itself).
    eval_se: the paired per-batch standard error (`paired_batch_se`), or None.
    eval_windows: as `paired_difference` reads it.

  Returns:
    {"verdict": "pays" | "does not pay" | "no difference" | "not judged", "paired": the paired difference
    or None, "differences_at_cost": per seed (None where the cost lies outside the anchor's budgets),
    "anchor_above_envelope_at_n": per seed, "anchor_excess_at_n": per seed}.
  """
  diffs, above, excess = [], [], []
  for loss, cost, (steps, curve) in zip(losses, costs, curves):
    own, at_n = anchor_at_n(steps, curve, n) if len(steps) else (None, None)
    at_cost = curve_loss_at(steps, curve, cost) if len(steps) else None
    gap = None if own is None or at_n is None else own - at_n
    excess.append(gap)
    above.append(bool(gap is not None and gap > 0))
    ok = at_cost is not None and gap is not None and math.isfinite(loss)
    diffs.append(float(loss - at_cost - gap) if ok else None)
  out: Record = {
    "differences_at_cost": diffs,
    "anchor_above_envelope_at_n": above,
    "anchor_excess_at_n": excess,
    "paired": None,
    "verdict": "not judged",
  }
  if len(diffs) >= 2 and None not in diffs:
    out["paired"] = paired_difference(diffs, [0.0] * len(diffs), eval_se, eval_windows=eval_windows)
    out["verdict"] = PAYS[out["paired"]["verdict"]]
  return out
