"""Every rung's figures, as pure functions of the ladder's groups (recomputable from ladder.json)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from hybridjax.bench import arms as arms_lib
from hybridjax.bench import figures, protocol
from hybridjax.bench.studies import Config, Record
from hybridjax.bench.studies.ladder.rungs import RUNGS, TUNED_GROUPS, VERDICT, WITHIN, Rung, rungs_of, timing_key


def finite_curve(steps: list[float], losses: list[float]) -> tuple[list[float], list[float]]:
  """A baseline curve up to its first non-finite loss (a diverged run reaches nothing past it)."""
  k = next((i for i, x in enumerate(losses) if x is None or not math.isfinite(x)), len(losses))
  return list(steps[:k]), list(losses[:k])


def baseline_at(steps: list[float], losses: list[float], at: float) -> float | None:
  """The baseline's loss at `at` steps: the measured point where the curve has one (as the protocol
  reads its anchor at N), else the monotone envelope interpolated between its points."""
  if at in steps:
    x = losses[steps.index(at)]
    return x if x is not None and math.isfinite(x) else None
  steps, losses = finite_curve(steps, losses)
  return protocol.curve_loss_at(steps, losses, at) if steps else None


def seed_loss(run: Record, iterate: str) -> float:
  return run["final_raw"] if iterate == "raw" else run["final_averaged"]


def _mean_std(values: list[float]) -> Record:
  """{"mean", "std"} of `values` (`protocol.mean_std`: refused where there are none)."""
  return dict(zip(("mean", "std"), protocol.mean_std(values)))


def eval_record(groups: Record, name: str) -> Record | None:
  """The eval errors a group's differences are judged with (`figures.eval_errors`): its own where it
  has them (the tuned groups: their anchors' N and 1.25N runs), else the first tuned group's of the
  same scale (the same eval batches; a constant group's runs give no N/1.25N pair), named as such."""
  own = groups[name].get("eval")
  if own is not None:
    return own
  for g in TUNED_GROUPS:
    if groups.get(g, {}).get("eval") is not None:
      return groups[g]["eval"] | {"source": f"the {g} group's, on the same eval batches"}
  return None


def arm_figures(
  rung: Rung,
  group: Record,
  arm: str,
  control: str | None,
  ms: dict[str, dict[str, float]] | None,
  n: int,
  eval_se: float | None = None,
  predicts: bool = False,
  rounds: dict[str, dict[str, list[float | None]]] | None = None,
  eval_windows: int | None = None,
) -> Record:
  """One arm at one rung, per seed and summarised: the backward, pass and wall-clock ratios against
  the rung's budget curve (`figures.seed_ratios`; `rounds`: the timing's `rounds_ms`, which give the
  wall-clock ratios their spread over the timing rounds), whether the pass ratio pays
  (`protocol.cost_verdict`), the final-loss gap and paired difference at N, the paired difference from
  the arm's control; at R0 the equal-steps wall-clock ratio and the two nulls. Every paired difference
  is judged with `eval_se` (the paired per-batch standard error, over `eval_windows` batches) besides the
  seeds'. `predicts`: the arm is meant to predict steps (`arms.predicts`; `figures.exercise` marks it
  where its runs predicted none)."""
  runs, iterate = group["method_runs"][arm], rung.iterate
  seeds = sorted((s for s in runs if s in group["baseline"]), key=int)
  arm_runs, bases = [runs[s] for s in seeds], [group["baseline"][s] for s in seeds]
  ms, rounds = ms or {}, rounds or {}
  base_ms, arm_ms = ms.get("baseline", {}).get("baseline"), ms.get(arm)
  timed = (
    figures.round_times(None if base_ms is None else {"baseline": base_ms}, rounds.get("baseline")),
    figures.round_times(arm_ms, rounds.get(arm)),
  )

  def differ(a: list[float], b: list[float]) -> Record:
    return protocol.paired_difference(a, b, eval_se, eval_windows=eval_windows)

  losses = [seed_loss(r, iterate) for r in arm_runs]
  at_n = [baseline_at(b["steps"], b[iterate], n) for b in bases]
  curves = [finite_curve(b["steps"], b[iterate]) for b in bases]
  reaches = [
    protocol.steps_to_reach_at_n(*c, x, n) if c[0] else protocol.Reach(None, False) for c, x in zip(curves, losses)
  ]
  summaries, per = figures.seed_ratios(reaches, arm_runs, base_ms, arm_ms, *timed)
  out: Record = {"seeds": seeds, "loss": losses, "baseline_at_n": at_n, **summaries, "per_seed": per}
  costs = [x["method_cost"] for x in per["pass_ratio"]]
  out["verdict"] = protocol.cost_verdict(losses, costs, curves, n, eval_se, eval_windows=eval_windows)
  gaps = [None if a is None else (m - a) / a for m, a in zip(losses, at_n)]
  present = [g for g in gaps if g is not None]
  out["final_loss_gap"] = (_mean_std(present) if present else {"mean": None, "std": None}) | {"per_seed": gaps}
  out["vs_baseline_at_n"] = differ(losses, at_n) if len(seeds) >= 2 and None not in at_n else None
  control_runs = group["method_runs"].get(control or "", {})
  if control and all(s in control_runs for s in seeds) and len(seeds) >= 2:
    out["vs_control"] = differ(losses, [seed_loss(control_runs[s], iterate) for s in seeds])
    out["control"] = control
  exercised = figures.exercise(arm_runs, predicts)
  if exercised is not None:  # too few jumps or predicted steps a run (`figures.exercise`): it tested nothing
    out["exercise"] = exercised
  if rung.name == "R0":
    out["equal_steps"] = equal_steps(out, arm_runs, bases, iterate, base_ms, n, timed, differ)
  return out


def equal_steps(
  f: Record,
  runs: list[Record],
  bases: list[Record],
  iterate: str,
  base_ms: float | None,
  n: int,
  timed: tuple[Any, Any],
  differ: Callable[[list[float], list[float]], Record],
) -> Record:
  """R0 as the seed measured it: N steps of the arm (its figures `f`, its `runs` per seed) against N
  baseline steps (`bases`), in wall-clock (with its spread over the timing rounds, from `timed`: the
  baseline's and the arm's `figures.round_times`), with the final-loss gap at N; beside it the nulls
  (judged by `differ`), and the seed's criterion (a speedup at <= 2% gap)."""
  losses, at_n = f["loss"], f["baseline_at_n"]
  walls = [
    None if w["method_ms"] is None or base_ms is None else n * base_ms / w["method_ms"]
    for w in f["per_seed"]["wallclock_ratio"]
  ]
  wall_rounds = [figures.round_ratios(n, timed[0], r["step_kinds"], timed[1]) for r in runs]
  gaps = [(x - a) / a for x, a in zip(losses, at_n)]
  # The baseline stopped at the arm's backward passes: its loss there, its gap at N, and its own
  # equal-steps "speedup" (N steps' time over its steps' time).
  stop_losses = [baseline_at(b["steps"], b[iterate], r["backward_passes"]) for r, b in zip(runs, bases)]
  stop_gaps = [None if x is None else (x - a) / a for x, a in zip(stop_losses, at_n)]
  stop_walls = [n / max(r["backward_passes"], 1) for r in runs]
  present = [w for w in walls if w is not None]
  vs_control = f.get("vs_control")
  out: Record = {
    "wallclock_ratio": figures.with_spread(_mean_std(present), figures.round_spread(wall_rounds)) if present else None,
    "wallclock_per_seed": walls,
    "final_loss_gap": _mean_std(gaps) | {"per_seed": gaps},
    "within_2pct": [g <= WITHIN for g in gaps],
    "null_stopped_baseline": {
      "loss": stop_losses,
      "wallclock_ratio": _mean_std(stop_walls),
      "final_loss_gap": stop_gaps,
      "within_2pct": [g is not None and g <= WITHIN for g in stop_gaps],
    },
  }
  if len(runs) >= 2 and all(x is not None for x in stop_losses):
    out["vs_stopped_baseline"] = differ(losses, stop_losses)
  if vs_control is not None:
    out["vs_control"] = vs_control
  beats = [out.get("vs_stopped_baseline"), vs_control]
  compared = [d for d in beats if d is not None]
  out["claim"] = {
    "speedup_at_2pct": bool(present) and all(out["within_2pct"]) and out["wallclock_ratio"]["mean"] > 1,
    "beats_both_nulls": len(compared) == 2 and all(d["verdict"] == "lower" for d in compared),
    # An arm with no control (outer momentum) is judged against the one null it has.
    "beats_nulls_compared": bool(compared) and all(d["verdict"] == "lower" for d in compared),
    "nulls_compared": [name for name, d in zip(("stopped_baseline", "control"), beats) if d is not None],
  }
  return out


def rung_figures(
  config: Config,
  groups: Record,
  ms: Record,
  n: int,
  rounds: Record | None = None,
) -> dict[str, Record]:
  """Every chosen rung: its condition, and every arm's figures against its baseline (pure: the tests
  recompute it from ladder.json). `ms` and `rounds`: each timing's (`rungs.timing_key`) `ms_per_step`
  and `rounds_ms` (None, or a timing without them: a record from before they were kept)."""
  defined = arms_lib.arms(config)
  controls = {defined[m].control_of: m for m in defined if defined[m].control_of}
  out = {}
  for name in rungs_of(config):
    rung, key = RUNGS[name], timing_key(RUNGS[name].group)
    group = groups[rung.group]
    if rung.iterate == "chosen":  # R6: averaged where averaging helped on the tuning seeds, else raw
      rung = dataclasses.replace(rung, iterate=group["tuning"]["iterate"])
    errors = eval_record(groups, rung.group)
    se, windows = (None, None) if errors is None else (errors.get("paired_se"), errors.get("batches"))
    figs = {
      m: arm_figures(
        rung,
        group,
        m,
        None if defined[m].control else controls.get(m),
        ms.get(key),
        n,
        se,
        arms_lib.predicts(defined[m]),
        (rounds or {}).get(key),
        windows,
      )
      for m in group["methods"]
    }
    out[name] = {
      **dataclasses.asdict(rung),
      "verdict_rung": name in VERDICT,
      "lr": group["lr"],
      "seeds": group["seeds"],
      "eval": errors,
      "figures": {m: f for m, f in figs.items() if not defined[m].control},
      "controls": {m: f for m, f in figs.items() if defined[m].control},
    }
  return out


def timed_rung_figures(config: Config, groups: Record, timing: Record, n: int) -> dict[str, Record]:
  """`rung_figures` from a ladder record's `timing` (each timing's `ms_per_step` and `rounds_ms`)."""
  rounds = {k: v.get("rounds_ms") for k, v in timing.items()}
  return rung_figures(config, groups, {k: v["ms_per_step"] for k, v in timing.items()}, n, rounds)


def untuned_position(groups: Record, untuned_lr: float) -> Record:
  """Where the untuned LR falls against each sweep: its rank, or outside the grid."""
  out = {}
  for g in ("constant", "cosine"):  # AdamW's sweeps; Muon's LR is on another scale
    grid = groups.get(g, {}).get("sweep", {}).get("grid") or groups.get(g, {}).get("tuning", {}).get("grid")
    if not grid:
      continue
    best = groups[g]["lr"]
    where = "in the grid" if min(grid) <= untuned_lr <= max(grid) else ("below" if untuned_lr < min(grid) else "above")
    out[g] = {
      "grid": grid,
      "best_lr": best,
      "untuned_lr": untuned_lr,
      "untuned_vs_grid": where,
      "best_over_untuned": best / untuned_lr,
    }
  return out
