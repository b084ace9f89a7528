"""The benchmark protocol: from benchmark runs to the figures we report.

Pure numpy; nothing here imports jax or the rest of hybridjax.

The protocol compares a method with a baseline on one figure, the *step ratio*:

1. The baseline is trained once per step budget (several budgets, several seeds). Its runs give a curve of
   final eval loss against budget. `monotone_envelope` sorts that curve by budget and takes the running
   minimum of the losses, so the curve never goes up with more steps (a baseline with a larger budget is
   credited with the best loss of any smaller one).
2. A method run has a cost (`method_cost`, in baseline-step equivalents, e.g. backward passes) and reaches
   an eval loss L. `steps_to_reach` reads off the envelope the baseline steps needed to reach L,
   interpolating linearly in log(budget) between neighbouring budgets. Three outcomes:

   * reached: a number of steps inside [smallest budget, largest budget];
   * a lower bound: L is below the end of the curve, so the baseline needs *more* than its largest budget;
     we report the largest budget and flag it (the ratio is then conservative);
   * not reached (None): L is above the start of the curve; the baseline's smallest budget already does
     better, so the steps it needs are unknown.

3. `ratio` divides the baseline steps by the method's cost: above 1 means the method reached its loss with
   fewer steps than the baseline needs, which happens exactly when the method's loss is below the
   baseline curve at the method's cost (`curve_loss_at` is that inverse reading).
4. Per-seed ratios are aggregated by `summarize` (mean and sample std over the non-null values, with the
   counts of nulls and lower bounds), and two settings measured on the same seeds are compared with
   `paired_difference` (mean difference against twice its standard error). `mean_std` is the plain
   [mean, sample std] of a list of numbers.
5. A run that sits on an early plateau (`plateau_runs`: its eval loss at N/10 or at N more than a margin
   above the median of the same runs' over the seeds) is flagged; the ladder and the recipe then add
   headline seeds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np


def _curve(
  budgets: Sequence[float] | np.ndarray, losses: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """Validated (budgets, losses) as 1-D float arrays, in the order given."""
  b = np.asarray(budgets, dtype=np.float64)
  loss = np.asarray(losses, dtype=np.float64)
  if b.ndim != 1 or loss.ndim != 1:
    raise ValueError(f"budgets and losses must be 1-D, got shapes {b.shape} and {loss.shape}")
  if b.size == 0:
    raise ValueError("empty curve: at least one (budget, loss) point is needed")
  if b.size != loss.size:
    raise ValueError(f"mismatched lengths: {b.size} budgets but {loss.size} losses")
  if not np.all(np.isfinite(b)):
    raise ValueError(f"budgets must be finite, got {b.tolist()}")
  if np.any(b <= 0):
    raise ValueError(f"budgets must be positive (steps), got {b.tolist()}")
  if np.unique(b).size != b.size:
    values, counts = np.unique(b, return_counts=True)
    raise ValueError(f"duplicate budgets: {values[counts > 1].tolist()}")
  if not np.all(np.isfinite(loss)):
    raise ValueError(f"losses must be finite, got {loss.tolist()}")
  return b, loss


def monotone_envelope(
  budgets: Sequence[float] | np.ndarray, losses: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
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


@dataclasses.dataclass(frozen=True)
class Reach:
  """Baseline steps needed to reach a loss.

  Attributes:
    steps: the steps, or None when not reached (the target is above the start of the curve).
    lower_bound: True when the target is below the end of the curve: the baseline needs more than `steps`
      (its largest budget).
  """

  steps: float | None
  lower_bound: bool


def steps_to_reach(budgets: Sequence[float] | np.ndarray, losses: Sequence[float] | np.ndarray, target: float) -> Reach:
  """Baseline steps needed to reach eval loss `target`, read off the monotone envelope.

  Between the last budget b_i whose envelope is above the target and the next one b_{i+1} (the first at
  which the envelope is <= target), the steps are interpolated linearly in log(budget):
  log b = log b_i + (env_i - target) / (env_i - env_{i+1}) * (log b_{i+1} - log b_i).

  Args:
    budgets: step budgets of the baseline runs.
    losses: their final eval losses.
    target: the eval loss to reach.

  Returns:
    `Reach(steps, False)` when reached (steps in [smallest budget, largest budget]; the smallest budget when
    the target equals the envelope's start); `Reach(largest budget, True)` when the target is below the end
    of the envelope (a lower bound); `Reach(None, False)` when the target is above the start of the envelope
    or is NaN (not reached).

  Raises:
    ValueError: on a bad curve (see `monotone_envelope`).
  """
  b, env = monotone_envelope(budgets, losses)
  target = float(target)
  if math.isnan(target) or target > env[0]:
    return Reach(None, False)
  if target == env[0]:
    return Reach(float(b[0]), False)
  if target < env[-1]:
    return Reach(float(b[-1]), True)
  j = int(np.argmax(env <= target))  # the first budget at which the envelope is <= target; j >= 1 here
  if env[j] == target:
    return Reach(float(b[j]), False)
  lo, hi = b[j - 1], b[j]
  frac = (env[j - 1] - target) / (env[j - 1] - env[j])
  steps = lo * math.exp(frac * math.log(hi / lo))
  return Reach(float(min(max(steps, lo), hi)), False)


def curve_loss_at(
  budgets: Sequence[float] | np.ndarray, losses: Sequence[float] | np.ndarray, steps: float
) -> float | None:
  """The envelope's loss at `steps`, interpolated linearly in log(budget): the inverse of `steps_to_reach`.

  Args:
    budgets: step budgets of the baseline runs.
    losses: their final eval losses.
    steps: where to read the curve.

  Returns:
    The loss, or None when `steps` is outside [smallest budget, largest budget] (or NaN).

  Raises:
    ValueError: on a bad curve (see `monotone_envelope`).
  """
  b, env = monotone_envelope(budgets, losses)
  steps = float(steps)
  if not (b[0] <= steps <= b[-1]):
    return None
  j = int(np.searchsorted(b, steps, side="left"))
  if b[j] == steps:
    return float(env[j])
  lo, hi = b[j - 1], b[j]
  frac = math.log(steps / lo) / math.log(hi / lo)
  return float(env[j - 1] + frac * (env[j] - env[j - 1]))


def ratio(reach: Reach, method_cost: float) -> dict[str, Any]:
  """The step ratio: baseline steps needed to reach the method's loss over the method's cost.

  Args:
    reach: from `steps_to_reach` at the method's loss.
    method_cost: the method's cost in baseline-step equivalents (> 0).

  Returns:
    {"value": reach.steps / method_cost, or None when not reached, "lower_bound": reach.lower_bound,
    "baseline_steps": reach.steps, "method_cost": method_cost}.

  Raises:
    ValueError: when method_cost is not a positive finite number.
  """
  cost = float(method_cost)
  if not (math.isfinite(cost) and cost > 0):
    raise ValueError(f"method_cost must be a positive finite number, got {method_cost!r}")
  value = None if reach.steps is None else float(reach.steps) / cost
  return {"value": value, "lower_bound": bool(reach.lower_bound), "baseline_steps": reach.steps, "method_cost": cost}


def summarize(values: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Aggregates per-seed ratio dicts (from `ratio`).

  Lower bounds enter the mean at their (conservative) value; nulls are left out of the mean and std but
  counted.

  Args:
    values: one `ratio` dict per seed.

  Returns:
    {"mean": mean of the non-null values or None, "std": their sample std (ddof=1) or None with fewer than 2,
    "n": number of seeds, "n_null": number of None values, "n_lower_bound": number of lower bounds,
    "values": the values in order}.
  """
  vals = [None if v["value"] is None else float(v["value"]) for v in values]
  present = [v for v in vals if v is not None]
  return {
    "mean": float(np.mean(present)) if present else None,
    "std": float(np.std(present, ddof=1)) if len(present) >= 2 else None,
    "n": len(vals),
    "n_null": len(vals) - len(present),
    "n_lower_bound": sum(1 for v in values if v["lower_bound"]),
    "values": vals,
  }


def mean_std(xs: Sequence[float] | np.ndarray) -> list[float]:
  """[mean, sample std (ddof=1)] of `xs`; the std of a single value is 0.0.

  Raises:
    ValueError: when `xs` is empty.
  """
  x = np.asarray(xs, dtype=np.float64).ravel()
  if x.size == 0:
    raise ValueError("mean_std of an empty sequence")
  return [float(np.mean(x)), float(np.std(x, ddof=1)) if x.size > 1 else 0.0]


def paired_difference(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> dict[str, Any]:
  """Per-seed differences a_i - b_i of two settings measured on the same seeds.

  Args:
    a: one value per seed.
    b: one value per seed, in the same seed order.

  Returns:
    {"mean", "std" (ddof=1), "se" (std / sqrt(n)), "n", "differences", "verdict"}: the verdict is "no
    difference" when |mean| < 2 se (or se == 0 and mean == 0), else "lower" (a below b) when the mean is
    negative and "higher" when it is positive.

  Raises:
    ValueError: on mismatched lengths, fewer than 2 pairs, or non-finite values.
  """
  x = np.asarray(a, dtype=np.float64).ravel()
  y = np.asarray(b, dtype=np.float64).ravel()
  if x.size != y.size:
    raise ValueError(f"mismatched lengths: {x.size} values in a but {y.size} in b (pairs are per seed)")
  if x.size < 2:
    raise ValueError(f"at least 2 pairs are needed, got {x.size}")
  if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
    raise ValueError(f"values must be finite, got a={x.tolist()} b={y.tolist()}")
  d = x - y
  n = int(d.size)
  mean = float(np.mean(d))
  std = float(np.std(d, ddof=1))
  se = std / math.sqrt(n)
  if abs(mean) < 2 * se or (se == 0 and mean == 0):
    verdict = "no difference"
  else:
    verdict = "lower" if mean < 0 else "higher"
  return {"mean": mean, "std": std, "se": se, "n": n, "differences": d.tolist(), "verdict": verdict}


def eval_loss_near(curve: Sequence[dict[str, Any]], step: float) -> tuple[int, float] | None:
  """(step, raw eval loss) of the eval point of `curve` nearest `step`, or None when none lies within
  half an eval interval of it."""
  if not curve:
    return None
  steps = [p["step"] for p in curve]
  interval = min(b - a for a, b in zip([0] + steps, steps))
  p = min(curve, key=lambda p: abs(p["step"] - step))
  return (p["step"], p["eval_loss_raw"]) if abs(p["step"] - step) <= interval / 2 else None


def plateau_runs(curves: dict[str, dict[str, Sequence[dict[str, Any]]]], n: int, margin: float) -> list[dict[str, Any]]:
  """The runs that sit on an early plateau. `curves`: {label: {seed: eval curve}}, the runs of one
  setting per label. A run is flagged whose raw eval loss at N/10 or at N (the eval point nearest
  there) is more than `margin` (relative) above the median of its label's runs over the seeds, or
  not finite. Comparing a run with its own setting's other seeds flags a seed that fell behind, never
  a setting that is simply worse; a label with fewer than three seeds read is not judged."""
  flagged = []
  for label, per_seed in curves.items():
    for point in (n / 10, n):
      read = {s: eval_loss_near(c, point) for s, c in per_seed.items()}
      present = [v for v in read.values() if v is not None and math.isfinite(v[1])]
      if len(present) < 3:
        continue
      median = statistics.median(v[1] for v in present)
      for s, v in read.items():
        if v is not None and (not math.isfinite(v[1]) or v[1] > median * (1 + margin)):
          flagged.append({"run": label, "seed": s, "at_step": v[0], "loss": v[1], "median_over_seeds": median})
  return flagged
