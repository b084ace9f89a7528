"""How one optimizer's speed-up over another is read: each side on its own budget curve, both fitted,
read at N (docs/benchmark.md's vocabulary: a budget curve is a side's final loss per step budget, each
budget its own schedule).

* Reading (a), the primary: AdamW's steps to reach Muon's loss at N, over N.
* Reading (b): N over Muon's steps to reach AdamW's loss at N.

Each side's curves over the headline seeds are fitted together (`fit_curves`): L_s(T) = a_s + b (T/N)^(-c),
one level a_s per seed (the grand level plus the seed's offset), b and c shared. Both readings are made per
seed on the fitted curves, and only inside the budgets that seed ran: a reading that would need a budget
outside them is a bound (the nearest budget), never an extrapolation. The per-seed readings are combined
on the log scale (their geometric mean), with a 95% interval computed two ways, the wider kept:

* a paired bootstrap: the headline seeds resampled (the same draw for both sides: seed s of one side is
  paired with seed s of the other) and, where every run kept its per-window eval losses, the eval windows
  too (the same windows for every run: the windows are common to all of them), both sides refitted; its
  standard error with the t quantile at n - 1 df (`bootstrap_interval`);
* a t-interval on the per-seed log readings (n - 1 degrees of freedom).

A published cell's verdict (`cell_verdict`) reads reading (a)'s interval against 1.5x, a line drawn after its
first cell was read; a record of today's readings reads it against 1.0x (`verdict_against_one`), with the
field's range beside it, descriptively. The change between two cells (`cell_change`) has its own interval.

numpy and scipy; no jax.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.optimize
import scipy.stats

from hybridjax.bench import protocol, stats
from hybridjax.bench.studies import Record

# The exponent c of the fitted curve is searched on a log grid over this range, then on a finer grid
# around the coarse grid's best: budget curves of these models fall as T^-0.2 to T^-1.
C_RANGE = (0.02, 5.0)
COARSE_POINTS = 64
FINE_POINTS = 33
# Reading (a) above this lies above the field: Muon (or the best matrix optimizer) over a tuned AdamW
# reads at most 1.4x at 130M (Wen et al. 2025, Qiu et al. 2025) and 1.56-1.73x at 124M (modded-nanogpt's
# optimizer track), so an interval wholly above 1.5x is beyond what tuned comparisons report.
FIELD = 1.5


@dataclasses.dataclass(frozen=True)
class Curves:
  """One side's budget curves on its headline seeds.

  Attributes:
    seeds: the seeds, in order.
    steps: every budget any seed ran, ascending (steps).
    loss: (seeds, budgets) final eval losses, NaN where a seed did not run a budget.
    windows: (seeds, budgets, windows) each run's loss on each eval window (the same windows for every run),
      or None where some run kept none.
  """

  seeds: tuple[str, ...]
  steps: np.ndarray
  loss: np.ndarray
  windows: np.ndarray | None


CurvesLike = Curves | Mapping[str, Any]  # a side's `Curves`, or the mapping `curves_from` reads


def curves_from(per_seed: Mapping[str, Mapping[str, Any]], side: str = "side") -> Curves:
  """`Curves` from {seed: {"steps": [budget, ...], "loss": [loss, ...], "per_window": [[window loss, ...]
  per budget] (optional)}}; `side` names the side in errors.

  Raises:
    ValueError: on fewer than 2 seeds, a seed with fewer than 2 budgets, mismatched lengths, a non-positive
      budget, a non-finite loss, or per-window losses of different window counts.
  """
  if len(per_seed) < 2:
    raise ValueError(f"{side}: a factor needs its curves on at least 2 headline seeds, got {len(per_seed)}")
  seeds = tuple(sorted(per_seed, key=lambda s: (len(str(s)), str(s))))
  steps = sorted({float(t) for s in seeds for t in per_seed[s]["steps"]})
  if not steps or steps[0] <= 0:
    raise ValueError(f"{side}: budgets must be positive steps, got {steps}")
  loss = np.full((len(seeds), len(steps)), np.nan)
  have_windows = all(per_seed[s].get("per_window") is not None for s in seeds)
  placed = []  # (seed's row, budget's column, its run's per-window losses)
  for i, s in enumerate(seeds):
    budgets, losses = list(per_seed[s]["steps"]), list(per_seed[s]["loss"])
    if len(budgets) != len(losses) or len(set(budgets)) != len(budgets):
      raise ValueError(f"{side} seed {s}: {len(budgets)} budgets (distinct?) but {len(losses)} losses")
    if len(budgets) < 2:
      raise ValueError(f"{side} seed {s}: a curve needs at least 2 budgets, got {budgets}")
    if not np.all(np.isfinite(losses)):
      raise ValueError(f"{side} seed {s}: losses must be finite, got {losses}")
    columns = [steps.index(float(t)) for t in budgets]
    loss[i, columns] = losses
    if have_windows:
      placed += [(i, j, per_seed[s]["per_window"][k]) for k, j in enumerate(columns)]
  win = None
  if have_windows:
    counts = {len(w) for _, _, w in placed}
    if len(counts) != 1:
      raise ValueError(f"{side}: every run's per-window losses must cover the same windows, got counts {counts}")
    win = np.full((len(seeds), len(steps), counts.pop()), np.nan)
    for i, j, w in placed:
      win[i, j] = w
  return Curves(seeds, np.asarray(steps), loss, win)


def _profile(t: np.ndarray, y: np.ndarray, w: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """For each exponent in `c` (..., G): the least-squares (levels (..., G, S), slope b (..., G), residual
  sum of squares (..., G)) of y (..., S, I) = a_s + b t^-c over the points where w (..., S, I) is 1."""
  x = t ** (-c[..., :, None])  # (..., G, I)
  x = x[..., :, None, :]  # (..., G, 1, I)
  y, w = y[..., None, :, :], w[..., None, :, :]  # (..., 1, S, I)
  count = np.maximum(w.sum(-1), 1.0)
  xbar = (w * x).sum(-1) / count  # (..., G, S)
  ybar = (w * y).sum(-1) / count  # (..., 1, S)
  dx, dy = w * (x - xbar[..., None]), w * (y - ybar[..., None])
  sxx, sxy, syy = (dx * dx).sum((-1, -2)), (dx * dy).sum((-1, -2)), (dy * dy).sum((-1, -2))
  b = sxy / np.where(sxx > 0, sxx, np.inf)
  rss = syy - b * sxy
  rss = np.where(b > 0, rss, np.inf)  # a curve that does not fall with its budget is no reading
  levels = ybar - b[..., None] * xbar
  return levels, b, rss


Fit = dict[str, np.ndarray]  # a fit of `fit_curves`: its levels, b, c and rss


def fit_curves(t: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> Fit:
  """Least-squares fit of y_si = a_s + b t_i^-c (one level per seed, b > 0 and c shared), batched over any
  leading axes of `y`.

  Args:
    t: (I,) budgets over N.
    y: (..., S, I) losses.
    w: (..., S, I) 1 where a point counts, 0 where it is absent (its y is ignored); all ones if None.

  Returns:
    {"levels": (..., S), "b": (...), "c": (...), "rss": (...)}; NaN throughout where no exponent in
    `C_RANGE` gives a falling curve (b > 0).
  """
  t = np.asarray(t, dtype=np.float64)
  y = np.asarray(y, dtype=np.float64)
  w = np.ones_like(y) if w is None else np.asarray(w, dtype=np.float64)
  y = np.where(w > 0, y, 0.0)
  batch = y.shape[:-2]
  coarse = np.exp(np.linspace(math.log(C_RANGE[0]), math.log(C_RANGE[1]), COARSE_POINTS))
  _, _, rss = _profile(t, y, w, np.broadcast_to(coarse, batch + coarse.shape))
  best = coarse[np.argmin(rss, axis=-1)]  # (...)
  step = math.log(coarse[1] / coarse[0])
  fine = best[..., None] * np.exp(np.linspace(-step, step, FINE_POINTS))
  fine = np.clip(fine, *C_RANGE)
  levels, b, rss = _profile(t, y, w, fine)
  # Then the vertex of the parabola (in log c) through the fine grid's best and its neighbours, kept where
  # it fits better: c to a small fraction of the fine grid's spacing.
  pick = lambda a, k: np.take_along_axis(a, k, axis=-1)[..., 0]  # noqa: E731  # a[..., k] along the grid
  k = np.clip(np.argmin(rss, axis=-1), 1, FINE_POINTS - 2)[..., None]
  r0, r1, r2 = (pick(rss, k + d) for d in (-1, 0, 1))
  h = 2 * step / (FINE_POINTS - 1)  # the fine grid's spacing in log c
  with np.errstate(invalid="ignore", divide="ignore"):
    shift = np.where(np.isfinite(r0 + r2) & (r0 + r2 - 2 * r1 > 0), 0.5 * h * (r0 - r2) / (r0 + r2 - 2 * r1), 0.0)
  vertex = np.clip(pick(fine, k) * np.exp(np.clip(shift, -h, h)), *C_RANGE)
  fine = np.concatenate([fine, vertex[..., None]], axis=-1)
  levels2, b2, rss2 = _profile(t, y, w, vertex[..., None])
  levels = np.concatenate([levels, levels2], axis=-2)
  b, rss = np.concatenate([b, b2], axis=-1), np.concatenate([rss, rss2], axis=-1)
  k = np.argmin(rss, axis=-1)[..., None]
  out = {"levels": np.take_along_axis(levels, k[..., None], axis=-2)[..., 0, :]}
  out |= {name: pick(a, k) for name, a in (("b", b), ("c", fine), ("rss", rss))}
  bad = ~np.isfinite(out["rss"])
  return {name: np.where(bad[..., None] if name == "levels" else bad, np.nan, a) for name, a in out.items()}


def _loss_at(fit: Fit, t: float) -> np.ndarray:
  """The fitted loss per seed at t (budget over N): (..., S)."""
  return fit["levels"] + fit["b"][..., None] * t ** (-fit["c"][..., None])


def _steps_to(fit: Fit, target: np.ndarray) -> np.ndarray:
  """Per seed, the t (budget over N) at which the fitted curve reaches `target` (..., S); inf where it never
  does (the target at or below the seed's asymptote)."""
  gap = target - fit["levels"]
  with np.errstate(divide="ignore", invalid="ignore"):
    t = (gap / fit["b"][..., None]) ** (-1.0 / fit["c"][..., None])
  return np.where(gap > 0, t, np.inf)


def _clamp(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(t clamped into [lo, hi], -1 where it was below lo, +1 above hi, 0 inside)."""
  side = np.where(t < lo, -1, np.where(t > hi, 1, 0))
  return np.clip(t, lo, hi), side


def _readings(
  adamw: Fit,
  muon: Fit,
  ranges: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Per seed, reading (a) and (b) (..., S) on the fitted curves, each clamped into the budgets run, with
  its bound: +1 where the true reading lies above the value given (a lower bound), -1 below it (an upper
  bound), 0 where it is inside."""
  a_lo, a_hi, m_lo, m_hi = ranges
  t_a, side_a = _clamp(_steps_to(adamw, _loss_at(muon, 1.0)), a_lo, a_hi)
  t_m, side_m = _clamp(_steps_to(muon, _loss_at(adamw, 1.0)), m_lo, m_hi)
  # (a) = t_a grows with AdamW's steps; (b) = 1 / t_m falls with Muon's.
  return {"a": (t_a, side_a), "b": (1.0 / t_m, -side_m)}


def _paired(adamw: CurvesLike, muon: CurvesLike) -> tuple[Curves, Curves]:
  """Both sides' `Curves` (a mapping read by `curves_from`), refused where they run other headline seeds."""
  adamw, muon = (c if isinstance(c, Curves) else curves_from(c, name) for c, name in ((adamw, "adamw"), (muon, "muon")))
  if adamw.seeds != muon.seeds:
    raise ValueError(
      f"the two sides must run the same headline seeds (the readings pair them): adamw {list(adamw.seeds)}, "
      f"muon {list(muon.seeds)}"
    )
  return adamw, muon


def _range(c: Curves, n: float) -> tuple[np.ndarray, np.ndarray]:
  """Per seed, the smallest and largest budget it ran, over N."""
  ran = np.isfinite(c.loss)
  t = c.steps / n
  return np.where(ran, t, np.inf).min(-1), np.where(ran, t, -np.inf).max(-1)


def _bound_word(sides: np.ndarray) -> str | None:
  """The geometric mean's bound from its seeds': 'lower' where some seed is a lower bound and none an
  upper one, 'upper' the reverse, 'both' where seeds bound it both ways, None where every seed is read."""
  lower, upper = bool(np.any(sides > 0)), bool(np.any(sides < 0))
  return "both" if lower and upper else "lower" if lower else "upper" if upper else None


def factor(
  adamw: CurvesLike,
  muon: CurvesLike,
  n: float,
  draws: int = 2000,
  seed: int = 0,
) -> Record:
  """Both readings of Muon's factor over AdamW at N, with their 95% intervals.

  Args:
    adamw: AdamW's curves (`Curves`, or the mapping `curves_from` reads).
    muon: Muon's, on the same seeds.
    n: N, the budget the factor is read at (steps).
    draws: the bootstrap's draws.
    seed: the bootstrap's random seed (recorded: the interval is reproducible).

  Returns:
    {"n", "seeds", "fits": {side: {"a" (the grand level), "b", "c", "offsets" (per seed), "rss"}},
    "windows_resampled": whether the bootstrap resampled eval windows, "draws", "bootstrap_seed",
    "a" and "b": each {"seeds", "mean": the geometric mean over the seeds, "bound": None, 'lower' (the factor
    is at least the mean: some seed's reading needs a budget beyond those run), 'upper' or 'both',
    "per_seed", "per_seed_bound" (+1 lower bound, -1 upper, 0 read), "ci95": the wider of "ci95_bootstrap"
    (`bootstrap_interval`) and "ci95_t" (`t_interval`), "interval": which, "ci95_bootstrap_percentile": the
    draws' 2.5-97.5 percentiles (shown, not used), "se_log_bootstrap": the draws' sd of the log mean,
    "failed_draws": bootstrap draws whose fit did not fall with budget,
    "bounded_draws": the share of draws with a bounded seed}}.

  Raises:
    ValueError: on bad curves (`curves_from`), unpaired seeds, or a side whose curves do not fall with budget.
  """
  adamw, muon = _paired(adamw, muon)
  n = float(n)
  ranges = (*_range(adamw, n), *_range(muon, n))
  fits = {}
  for name, c in (("adamw", adamw), ("muon", muon)):
    f = fit_curves(c.steps / n, c.loss, np.isfinite(c.loss).astype(np.float64))
    if not np.isfinite(f["b"]):
      raise ValueError(
        f"{name}: its curves do not fall with the budget on a fit L = a_s + b T^-c (b > 0), so no factor can be "
        f"read at N = {n:g}: a longer budget must lower the loss beyond the seeds' spread. Train longer runs (a "
        "larger --config.trainer.steps, or a larger preset such as long); the runs trained stay in the run cache"
      )
    fits[name] = f
  point = _readings(*fits.values(), ranges)
  boot = _bootstrap(adamw, muon, n, ranges, draws, seed)
  out: Record = {
    "n": n,
    "seeds": list(adamw.seeds),
    "fits": {
      k: {
        "a": float(np.mean(f["levels"])),
        "b": float(f["b"]),
        "c": float(f["c"]),
        "offsets": (f["levels"] - np.mean(f["levels"])).tolist(),
        "rss": float(f["rss"]),
      }
      for k, f in fits.items()
    },
    "windows_resampled": adamw.windows is not None and muon.windows is not None,
    "draws": int(draws),
    "bootstrap_seed": int(seed),
  }
  for reading in ("a", "b"):
    values, sides = point[reading]
    logs = np.log(values)
    t_ci = t_interval(logs)
    b_logs, b_failed, b_bounded = boot[reading]
    b_ci = bootstrap_interval(float(np.mean(logs)), b_logs, logs.size)
    wider = "t" if math.log(t_ci[1] / t_ci[0]) > math.log(b_ci[1] / b_ci[0]) else "bootstrap"
    out[reading] = {
      "seeds": list(adamw.seeds),
      "mean": float(np.exp(np.mean(logs))),
      "bound": _bound_word(sides),
      "per_seed": values.tolist(),
      "per_seed_bound": sides.astype(int).tolist(),
      "ci95": t_ci if wider == "t" else b_ci,
      "ci95_bootstrap": b_ci,
      "ci95_t": t_ci,
      "ci95_bootstrap_percentile": [float(np.exp(np.percentile(b_logs, q))) for q in (2.5, 97.5)],
      "se_log_bootstrap": float(np.std(b_logs, ddof=1)),
      "interval": wider,
      "failed_draws": int(b_failed),
      "bounded_draws": float(b_bounded),
    }
  return out


def interpolated(adamw: CurvesLike, muon: CurvesLike, n: float) -> Record:
  """Both readings without the fit, printed beside `factor`'s: per seed, a side's steps to reach the other
  side's own loss at N on its own budget points (`protocol.steps_to_reach`: linear in log budget along their
  monotone envelope; outside the budgets run, a bound at the nearest budget), over N for reading (a), N over
  them for (b); the geometric mean over the seeds with its t-interval (`t_interval`).

  Returns:
    {"a", "b"}: each {"mean", "ci95_t", "per_seed", "per_seed_bound" (as `factor`'s), "bound"}.
  """
  adamw, muon = _paired(adamw, muon)
  out = {}
  for reading, side, other in (("a", adamw, muon), ("b", muon, adamw)):
    values, sides = [], []
    for i in range(len(side.seeds)):
      ran = np.isfinite(side.loss[i])
      target = float(other.loss[i][list(other.steps).index(float(n))])
      reach = protocol.steps_to_reach(side.steps[ran], side.loss[i][ran], target)
      t, bound = reach.steps / float(n), int(reach.lower_bound) - int(reach.upper_bound)
      values.append(t if reading == "a" else 1.0 / t)
      sides.append(bound if reading == "a" else -bound)
    logs = np.log(values)
    out[reading] = {
      "mean": float(np.exp(np.mean(logs))),
      "ci95_t": t_interval(logs),
      "per_seed": values,
      "per_seed_bound": sides,
      "bound": _bound_word(np.asarray(sides)),
    }
  return out


def t_interval(logs: np.ndarray) -> list[float]:
  """The 95% t-interval of the geometric mean from per-seed log readings (n - 1 degrees of freedom),
  back on the ratio scale.

  Raises:
    ValueError: with fewer than 2 readings.
  """
  logs = np.asarray(logs, dtype=np.float64)
  if logs.size < 2:
    raise ValueError(f"a t-interval needs at least 2 seeds' readings, got {logs.size}")
  half = float(scipy.stats.t.ppf(0.975, logs.size - 1)) * float(np.std(logs, ddof=1)) / math.sqrt(logs.size)
  return _interval(float(np.mean(logs)), half)


def _interval(mean_log: float, half: float) -> list[float]:
  """[exp(mean_log - half), exp(mean_log + half)]: a log-scale interval back on the ratio scale."""
  return [math.exp(mean_log - half), math.exp(mean_log + half)]


def bootstrap_interval(mean_log: float, draws: np.ndarray, seeds: int) -> list[float]:
  """The bootstrap's 95% interval of the geometric mean: exp(mean_log +- t(0.975, seeds - 1) * the standard
  deviation of the draws' log geometric means), on the ratio scale.

  Not the draws' 2.5-97.5 percentiles: over 5 seeds those cover a known factor about 89% of the time on
  curves of the measured noise (a bootstrap over n seeds draws spread sqrt((n - 1) / n) of the seeds' and
  the normal's quantile is too short at n - 1 df), below the 95% they name; the t quantile on the bootstrap's
  standard error keeps the error of the shared fit (b, c: common to every seed's reading, unseen by a
  t-interval over the seeds) and the small-sample quantile both (tests/bench/test_factor.py's coverage test).
  """
  return _interval(mean_log, float(scipy.stats.t.ppf(0.975, seeds - 1)) * float(np.std(draws, ddof=1)))


def _bootstrap(
  adamw: Curves, muon: Curves, n: float, ranges: tuple[np.ndarray, ...], draws: int, seed: int
) -> dict[str, tuple[np.ndarray, int, float]]:
  """Per reading: (the log geometric means of the draws whose fits fall with budget, how many did not,
  the share of kept draws with a bounded seed). Each draw resamples the seeds (both sides alike) and,
  where both sides kept per-window losses, the windows (every run alike): each run's loss moves by its
  resampled window mean's departure from its full window mean."""
  if draws < 100:
    raise ValueError(f"a 95% bootstrap interval needs at least 100 draws, got {draws}")
  rng = np.random.default_rng(seed)
  seeds = len(adamw.seeds)
  idx = rng.integers(0, seeds, size=(draws, seeds))
  counts = None
  if adamw.windows is not None and muon.windows is not None:
    j = adamw.windows.shape[-1]
    if muon.windows.shape[-1] != j:
      raise ValueError("the two sides' runs must be scored on the same eval windows")
    counts = np.stack([np.bincount(rng.integers(0, j, size=j), minlength=j) for _ in range(draws)]) / j
  fits = []  # adamw's, muon's
  for c in (adamw, muon):
    ran = np.isfinite(c.loss)
    y = np.where(ran, c.loss, 0.0)[idx]  # (draws, S, I)
    if counts is not None:
      w = np.nan_to_num(c.windows)
      moved = np.einsum("sij,dj->dsi", w, counts) - w.mean(-1)  # (draws, seeds, budgets): every seed's run
      y = y + np.take_along_axis(moved, idx[..., None], axis=1)
    fits.append(fit_curves(c.steps / n, y, ran[idx].astype(np.float64)))
  read = _readings(*fits, tuple(r[idx] for r in ranges))
  ok = np.isfinite(fits[0]["b"]) & np.isfinite(fits[1]["b"])
  out = {}
  for reading, (values, sides) in read.items():
    logs = np.log(values[ok]).mean(-1)
    out[reading] = (logs, int((~ok).sum()), float(np.mean(np.any(sides[ok] != 0, axis=-1))) if ok.any() else 0.0)
  return out


def cell_verdict(reading_a: Mapping[str, Any]) -> str:
  """A cell's verdict from reading (a) (`factor(...)["a"]`): "above the field" where its 95% interval lies
  above `FIELD` (1.5x), "within the field" where it lies below, "undetermined" otherwise. A reading that is
  a bound has an open end: a lower bound's interval runs on above its top, an upper bound's below its
  bottom."""
  lo, hi = _open_interval(reading_a)
  return "above the field" if lo > FIELD else "within the field" if hi < FIELD else "undetermined"


def _open_interval(reading: Mapping[str, Any]) -> tuple[float, float]:
  """A reading's 95% interval, open on the side it is a bound: a lower bound's runs on above its top, an upper
  bound's below its bottom."""
  lo, hi = (float(x) for x in reading["ci95"])
  bound = reading.get("bound")
  return 0.0 if bound in ("upper", "both") else lo, math.inf if bound in ("lower", "both") else hi


AGAINST = 1.0  # a record of today's readings reads its verdict against 1.0x: a line declared before any seed
POWER = 0.8  # the power at which `detectable` names the smallest factor the seeds could tell from 1.0x


def detectable(ci95: list[float], seeds: int) -> float:
  """The smallest factor a reading with 95% interval `ci95` over `seeds` seeds could tell from 1.0x at
  `POWER`: exp(d), d the shift of the log mean at which a two-sided 5% t-test (seeds - 1 df, the interval's
  standard error) rejects with probability `POWER` (scipy's noncentral t)."""
  df = seeds - 1
  crit = float(scipy.stats.t.ppf(0.975, df))
  se = math.log(ci95[1] / ci95[0]) / (2 * crit)
  # scipy's noncentral t returns NaN far in its tail, where the power is 1
  reject = lambda x: float(np.nan_to_num(scipy.stats.nct.sf(crit, df, x) + scipy.stats.nct.cdf(-crit, df, x), nan=1.0))
  ncp = scipy.optimize.brentq(lambda x: reject(x) - POWER, 0.0, 2 * crit + 10)
  return math.exp(ncp * se)


def verdict_against_one(reading_a: Mapping[str, Any], field: tuple[float, float] | None = None) -> Record:
  """Reading (a)'s verdict against `AGAINST` (1.0x): "above 1.0×" where its 95% interval lies above it,
  "below 1.0×" where below, else "undetermined", with the smallest factor its seeds could tell from 1.0x
  (`detectable`); a bound's interval is open on its side (as `cell_verdict` reads it). `field`: the field's
  range (low, high), which the interval is placed against descriptively: 'inside', 'overlapping', 'above' or
  'below' it.

  Returns:
    {"against", "verdict", "detectable", "power", "field", "against_field"}.
  """
  lo, hi = _open_interval(reading_a)
  word = "above 1.0×" if lo > AGAINST else "below 1.0×" if hi < AGAINST else "undetermined"
  place = None
  if field is not None:
    a, b = field
    place = "above" if lo > b else "below" if hi < a else "inside" if a <= lo and hi <= b else "overlapping"
  return {
    "against": AGAINST,
    "verdict": word,
    "detectable": detectable(reading_a["ci95"], len(reading_a["per_seed"])),
    "power": POWER,
    "field": list(field) if field else None,
    "against_field": place,
  }


def cell_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> Record:
  """The change of one reading between two cells (`factor(...)["a"]` of each): after / before, with a 95%
  interval computed two ways, the wider kept: the two bootstrap standard errors of the log means together
  (the cells' runs are their own), t at Satterthwaite's df; and, where both cells read the same seeds, a
  t-interval on the per-seed log ratios (n - 1 df). A cell whose reading is a bound makes the change a bound
  too (`bound`: the bound of after / before, or 'both').

  Returns:
    {"ratio", "ci95", "ci95_bootstrap", "ci95_t" (None where the seeds differ), "interval", "bound"}.
  """
  delta = math.log(after["mean"]) - math.log(before["mean"])
  se_b, se_a = float(before["se_log_bootstrap"]), float(after["se_log_bootstrap"])
  n_b, n_a = len(before["per_seed"]), len(after["per_seed"])
  df = stats.satterthwaite_df([(se_b, n_b - 1), (se_a, n_a - 1)])
  half = 0.0 if math.isnan(df) else float(scipy.stats.t.ppf(0.975, df)) * math.hypot(se_b, se_a)
  boot = _interval(delta, half)
  paired = None
  if n_b == n_a and before.get("seeds") == after.get("seeds"):
    paired = t_interval(np.log(after["per_seed"]) - np.log(before["per_seed"]))
  wider = "t" if paired is not None and paired[1] / paired[0] > boot[1] / boot[0] else "bootstrap"
  flips = {None: None, "lower": "upper", "upper": "lower", "both": "both"}
  bounds = {after.get("bound"), flips[before.get("bound")]} - {None}
  return {
    "ratio": math.exp(delta),
    "ci95": paired if wider == "t" else boot,
    "ci95_bootstrap": boot,
    "ci95_t": paired,
    "interval": wider,
    "bound": None if not bounds else bounds.pop() if len(bounds) == 1 else "both",
  }
