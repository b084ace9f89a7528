"""The fairness ladder: every method arm measured from a claim's own conditions up to a fair baseline.

A rung is a baseline condition; each arm is measured against the baseline of its rung, on the same
headline seeds, with the arm's settings as configured (no per-rung tuning):

  R0  the seed's claim: equal N schedule steps, the untuned LR held constant after warm-up; the
      wall-clock ratio for N steps and the final-loss gap at N, beside two nulls (the arm's control:
      the same decisions with no move; the baseline stopped at the arm's backward passes)
  R1  NiNo's: the untuned LR held constant, its budget curve
  R2  a constant LR, tuned (the sweep starts at the untuned LR)
  R3  the tuned LR with cosine decay, each budget its own schedule (the protocol's raw anchor)
  R4  R3 with weight averaging (the protocol's averaged anchor)                        -- verdict
  R5  Muon, tuned, cosine, averaged                                                      -- verdict
  R6  the speedrun recipe (`bench.recipe`: its architecture, Muon with its groups, its schedule),
      tuned, averaged where averaging helps on the tuning seeds                         -- verdict

R0-R3 compare raw iterates, R4-R5 averaged ones. A constant schedule is the cosine one with its floor
at the peak (`optim.min_lr_ratio=1.0`), so a constant LR's budget curve is the eval curve of one 2N
run per seed. Runs are shared where rungs allow (a *group*): R0/R1 share one set, R3/R4 another
(one run records its raw and its averaged iterate). Every run goes through the benchmark's runner
and cache, so anchors are shared across arms and a ladder resumes where it stopped.

Runs that sit on an early plateau (an eval loss at N/10 or at N more than `benchmark.plateau_margin`
above the median of the group's runs at that point) are flagged; where a group has one, its headline
seeds are extended by `benchmark.plateau_seeds`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import time
from typing import Any

import ml_collections

from hybridjax.bench import arms as arms_lib
from hybridjax.bench import family, figures, protocol, recipe, report, specs, timing, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner, make_runner


@dataclasses.dataclass(frozen=True)
class Rung:
  name: str
  claim: str  # whose conditions it reproduces
  baseline: str  # the baseline condition
  iterate: str  # 'raw', 'averaged', or 'chosen' (the one the group's tuning chose): compared, arm's and baseline's
  group: str  # the runs it reads: 'untuned', 'constant', 'cosine', 'muon', 'speedrun'


RUNGS = {
  "R0": Rung("R0", "the seed's claim", "equal N steps, untuned LR held constant", "raw", "untuned"),
  "R1": Rung("R1", "NiNo's", "untuned LR held constant, budget curve", "raw", "untuned"),
  "R2": Rung("R2", "", "constant LR, tuned", "raw", "constant"),
  "R3": Rung("R3", "", "tuned LR, cosine, each budget its own schedule", "raw", "cosine"),
  "R4": Rung("R4", "the verdict", "R3 with weight averaging", "averaged", "cosine"),
  "R5": Rung("R5", "the verdict", "Muon, tuned, cosine, averaged", "averaged", "muon"),
  "R6": Rung("R6", "the verdict", "the speedrun recipe, tuned", "chosen", "speedrun"),
}
VERDICT = ("R4", "R5", "R6")
GROUP_ORDER = ("cosine", "untuned", "constant", "muon", "speedrun")  # the verdict's runs first, the costliest last
TUNED_GROUPS = ("cosine", "muon", "speedrun")  # the groups that run the protocol's own tuning and budget curves
CONSTANT_GROUPS = ("untuned", "constant")
WITHIN = 0.02  # the seed's own criterion: a speedup counts at <= 2% final-loss gap


names = arms_lib.names


def rungs_of(config: ml_collections.ConfigDict) -> list[str]:
  return names(config.benchmark.ladder_rungs)


def arms_at(config: ml_collections.ConfigDict, group: str) -> list[str]:
  """The arms a group runs: `ladder_methods` everywhere; at R3-R6 also `ladder_cosine_methods` and
  the protocol's own arms (`benchmark.methods`), so the family results re-written from these runs
  keep every arm the protocol runs."""
  b = config.benchmark
  extra = names(b.ladder_cosine_methods) + names(b.methods) if group in TUNED_GROUPS else []
  return list(dict.fromkeys(names(b.ladder_methods) + extra))


def timing_key(group: str) -> str:
  """The timing a group's arms read: their own for Muon and the speedrun, AdamW's for the rest."""
  return group if group in ("muon", "speedrun") else "adamw"


def validate_ladder(config: ml_collections.ConfigDict) -> None:
  """Checks the ladder's fields; errors name the field and the fix."""
  b = config.benchmark
  errors = []
  bad = [r for r in rungs_of(config) if r not in RUNGS]
  if bad or not rungs_of(config):
    errors.append(f"benchmark.ladder_rungs={b.ladder_rungs!r}: give rungs from {','.join(RUNGS)}")
  defined = arms_lib.arms(config)
  for field in ("ladder_methods", "ladder_cosine_methods"):
    unknown = [m for m in names(b[field]) if m not in defined]
    if unknown:
      errors.append(f"benchmark.{field} names {unknown}, not arms of benchmark.arms ({','.join(defined)})")
  if not float(b.untuned_lr) > 0:
    errors.append(f"benchmark.untuned_lr must be > 0, got {b.untuned_lr}")
  if int(b.constant_eval_points) < 4:
    errors.append(
      f"benchmark.constant_eval_points must be >= 4 (eval points over a 2N constant run), got {b.constant_eval_points}"
    )
  if errors:
    raise ValueError("; ".join(errors))


def group_config(config: ml_collections.ConfigDict, group: str, seeds: list[int]) -> ml_collections.ConfigDict:
  """The benchmark config whose runs a group trains: constant schedules for R0-R2 (the untuned LR for
  R0/R1), the `benchmark.muon` overrides for R5, the whole recipe for R6; `seeds` as its headline seeds."""
  c = ml_collections.ConfigDict(config.to_dict())
  if group in CONSTANT_GROUPS:
    c.optim.schedule = "cosine"
    c.optim.min_lr_ratio = 1.0  # cosine with its floor at the peak: constant after the warm-up
  if group == "untuned":
    c.optim.learning_rate = float(config.benchmark.untuned_lr)
  if group == "muon":
    c.update_from_flattened_dict({"optim." + k: v for k, v in config.benchmark.muon.to_dict().items()})
  if group == "speedrun":
    c = recipe.speedrun_config(c)
  c.benchmark.seeds = tuple(int(s) for s in seeds)
  if group != "speedrun":  # the recipe names its own family
    c.benchmark.family = f"{c.optim.name}-{'constant' if group in CONSTANT_GROUPS else c.optim.schedule}"
  c.benchmark.methods = ",".join(arms_at(config, group))
  return c


def constant_curve_spec(config: ml_collections.ConfigDict, seed: int, lr: float) -> dict[str, Any]:
  """One 2N run at a constant LR, evaluated `constant_eval_points` times: its eval curve is the
  budget curve of every budget up to 2N (a constant schedule does not depend on the budget)."""
  n = int(config.trainer.steps)
  spec = specs.run_spec(config, kind="anchor", seed=seed, lr=lr, steps=2 * n, beta=float(config.trainer.averaging_beta))
  every = max(2 * n // int(config.benchmark.constant_eval_points), 1)
  spec["config"]["trainer"].update(eval_every=every, log_every=every)
  return spec


def constant_sweep(config: ml_collections.ConfigDict, runner: Runner) -> dict[str, Any]:
  """R2's LR sweep at a constant LR on the tuning seeds: a sqrt(2) grid upwards from the untuned LR,
  extended while the best sits at an edge; ranked by the raw loss at N (R2's iterate); the best two
  checked on the second tuning seed."""
  b = config.benchmark
  n = int(config.trainer.steps)
  t1, t2 = (int(s) for s in b.tuning_seeds)
  beta = float(config.trainer.averaging_beta)

  def spec(seed, lr):
    return specs.run_spec(config, kind="anchor", seed=seed, lr=lr, steps=n, beta=beta)

  start = float(b.untuned_lr)
  grid = [tuning.round_lr(start * math.sqrt(2) ** i) for i in range(int(b.lr_points))]
  sweep = runner.run([spec(t1, lr) for lr in grid], "R2 sweep, constant LR (tuning seed 1, N)")
  for _ in range(int(b.lr_max_extensions)):
    best = min(range(len(grid)), key=lambda i: sweep[i]["final_raw"])
    if 0 < best < len(grid) - 1:
      break
    new = tuning.round_lr(grid[0] / math.sqrt(2) if best == 0 else grid[-1] * math.sqrt(2))
    result = runner.run([spec(t1, new)], "R2 sweep: the best LR is at the grid's edge; extending")[0]
    grid, sweep = ([new] + grid, [result] + sweep) if best == 0 else (grid + [new], sweep + [result])
  ranked = sorted(range(len(grid)), key=lambda i: sweep[i]["final_raw"])
  top2 = [grid[i] for i in ranked[:2]]
  second = runner.run([spec(t2, lr) for lr in top2], "R2 check (tuning seed 2, N)")
  means = {lr: (sweep[grid.index(lr)]["final_raw"] + r["final_raw"]) / 2 for lr, r in zip(top2, second)}
  best_lr = min(means, key=means.get)
  return {
    "grid": grid,
    "raw_loss": [r["final_raw"] for r in sweep],
    "best_two_means": {str(k): v for k, v in means.items()},
    "best_lr": best_lr,
    "best_at_edge": ranked[0] in (0, len(grid) - 1),
  }


def method_record(r: dict[str, Any]) -> dict[str, Any]:
  """What ladder.json keeps of a method run: enough to recompute every figure."""
  keep = ("method", "seed", "lr", "steps", "final_raw", "final_averaged", "backward_passes", "validation_forwards")
  return {k: r[k] for k in keep} | {"step_kinds": r["step_kinds"], "curve": r["curve"], "key": r.get("key")}


def train_group(config: ml_collections.ConfigDict, group: str, runner: Runner) -> dict[str, Any]:
  """A group's runs, as plain data: per seed the baseline's curve ({'steps', 'raw', 'averaged'} and
  the N-step run's curve for the plateau check), and every arm's method runs."""
  n = int(config.trainer.steps)
  b = config.benchmark
  methods = names(b.methods)
  seeds = [int(s) for s in b.seeds]
  out: dict[str, Any] = {"seeds": seeds, "methods": methods, "family": b.family}
  beta = float(config.trainer.averaging_beta)
  if group in CONSTANT_GROUPS:
    if group == "untuned":
      lr = float(b.untuned_lr)
    else:
      out["sweep"] = constant_sweep(config, runner)
      lr = out["sweep"]["best_lr"]
    curve_specs = [constant_curve_spec(config, s, lr) for s in seeds]
    mspecs = tuning.method_specs(config, methods, lr, beta)
    results = runner.run(curve_specs + mspecs, f"{group} group: 2N constant curves and the arms")
    out["lr"], out["beta"] = lr, beta
    out["baseline"] = {
      str(r["seed"]): {
        "steps": [p["step"] for p in r["curve"]],
        "raw": [p["eval_loss_raw"] for p in r["curve"]],
        "averaged": [p["eval_loss_averaged"] for p in r["curve"]],
        "key": r.get("key"),
      }
      for r in results[: len(seeds)]
    }
    mruns = results[len(seeds) :]
  else:
    trained = family.train_family(config, runner, methods)
    out["family_runs"] = trained
    tuned, curves = trained["tuning"], trained["curves"]
    out["eval"] = figures.eval_errors(curves["runs"], [str(s) for s in seeds], curves["budgets"], n)
    out["lr"], out["beta"] = tuned["best_lr"], tuned["averaging_beta"]
    keep = ("grid", "best_lr", "best_lr_for_raw_loss", "best_at_edge", "averaging_beta", "per_budget_lr", "seed_noise")
    keep += ("iterate", "iterate_losses")
    out["tuning"] = {k: tuned[k] for k in keep}
    out["baseline"] = {
      s: {
        "steps": curves["budgets"],
        "raw": curves["curves"]["baseline"][s],
        "averaged": curves["curves"]["averaged_baseline"][s],
        "n_run_curve": curves["runs"][f"{s}/{n}"]["curve"],
        "key": curves["runs"][f"{s}/{n}"].get("key"),
      }
      for s in curves["curves"]["baseline"]
    }
    mruns = [r for m in methods for r in trained["method_runs"][m].values()]
  out["method_runs"] = {m: {} for m in methods}
  for r in mruns:
    out["method_runs"][r["method"]][str(r["seed"])] = method_record(r)
  out["plateaus"] = plateaus(out, n, float(b.plateau_margin))
  return out


def plateaus(group: dict[str, Any], n: int, margin: float) -> list[dict[str, Any]]:
  """The group's runs that sit on an early plateau: a raw eval loss at N/10 or at N more than
  `margin` (relative) above the median of the same arm's runs (or the baseline's) over the seeds,
  read at the eval point nearest there. Comparing a run with its own arm's other seeds flags a seed
  that fell behind, never an arm that is simply worse."""
  kinds: dict[str, dict[str, list[dict[str, Any]]]] = {"baseline": {}}
  for s, base in group["baseline"].items():
    kinds["baseline"][s] = base.get("n_run_curve") or [
      {"step": t, "eval_loss_raw": raw} for t, raw in zip(base["steps"], base["raw"]) if t <= n
    ]
  for m, per in group["method_runs"].items():
    kinds[m] = {s: r["curve"] for s, r in per.items()}
  return protocol.plateau_runs(kinds, n, margin)


def train_all(config: ml_collections.ConfigDict, runner: Runner) -> dict[str, dict[str, Any]]:
  """Every group the chosen rungs need, in `GROUP_ORDER`; a group with a plateau run is extended to
  the plateau seeds (its runs already trained are cached)."""
  b = config.benchmark
  needed = {RUNGS[r].group for r in rungs_of(config)}
  groups: dict[str, dict[str, Any]] = {}
  for group in [g for g in GROUP_ORDER if g in needed]:
    seeds = [int(s) for s in b.seeds]
    groups[group] = train_group(group_config(config, group, seeds), group, runner)
    extra = [int(s) for s in b.plateau_seeds if int(s) not in seeds]
    if groups[group]["plateaus"] and extra:
      print(f"--- {group}: plateau runs {groups[group]['plateaus']}; adding seeds {extra}", flush=True)
      groups[group] = train_group(group_config(config, group, seeds + extra), group, runner)
      groups[group]["extended_for_plateau"] = True
  return groups


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


def seed_loss(run: dict[str, Any], iterate: str) -> float:
  return run["final_raw"] if iterate == "raw" else run["final_averaged"]


def eval_record(groups: dict[str, Any], name: str) -> dict[str, Any] | None:
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
  group: dict[str, Any],
  arm: str,
  control: str | None,
  ms: dict[str, dict[str, float]] | None,
  n: int,
  eval_se: float | None = None,
) -> dict[str, Any]:
  """One arm at one rung, per seed and summarised: the backward, pass and wall-clock ratios against
  the rung's budget curve, whether the pass ratio pays (`protocol.cost_verdict`), the final-loss gap
  and paired difference at N, the paired difference from the arm's control; at R0 the equal-steps
  wall-clock ratio and the two nulls. Every paired difference is judged with `eval_se` (the paired
  per-batch standard error) besides the seeds'."""
  runs = group["method_runs"][arm]
  seeds = sorted((s for s in runs if s in group["baseline"]), key=int)
  base_ms = None if ms is None else ms.get("baseline", {}).get("baseline")
  arm_ms = None if ms is None else ms.get(arm)
  per: dict[str, list[Any]] = {"backward_ratio": [], "pass_ratio": [], "wallclock_ratio": []}
  losses, at_n, curves = [], [], []
  for s in seeds:
    r, base = runs[s], group["baseline"][s]
    loss = seed_loss(r, rung.iterate)
    losses.append(loss)
    at_n.append(baseline_at(base["steps"], base[rung.iterate], n))
    steps, curve = finite_curve(base["steps"], base[rung.iterate])
    curves.append((steps, curve))
    reach = protocol.steps_to_reach(steps, curve, loss) if steps else protocol.Reach(None, False)
    per["backward_ratio"].append(protocol.ratio(reach, r["backward_passes"]))
    passes = r["backward_passes"] + figures.FORWARD_COST * r["validation_forwards"]
    per["pass_ratio"].append(protocol.ratio(reach, passes))
    wall = figures.run_ms(r["step_kinds"], arm_ms)
    value = None if (wall is None or base_ms is None or reach.steps is None) else reach.steps * base_ms / wall
    per["wallclock_ratio"].append(
      {"value": value, "lower_bound": reach.lower_bound, "upper_bound": reach.upper_bound, "method_ms": wall}
    )
  out: dict[str, Any] = {"seeds": seeds, "loss": losses, "baseline_at_n": at_n}
  out.update({k: protocol.summarize(v) for k, v in per.items()})
  out["per_seed"] = per
  costs = [x["method_cost"] for x in per["pass_ratio"]]
  out["verdict"] = protocol.cost_verdict(losses, costs, curves, n, eval_se)
  paired = len(seeds) >= 2 and None not in at_n
  gaps = [None if a is None else (m - a) / a for m, a in zip(losses, at_n)]
  present = [g for g in gaps if g is not None]
  out["final_loss_gap"] = dict(zip(("mean", "std"), protocol.mean_std(present) if present else (None, None)))
  out["final_loss_gap"]["per_seed"] = gaps
  out["vs_baseline_at_n"] = protocol.paired_difference(losses, at_n, eval_se) if paired else None
  control_runs = group["method_runs"].get(control or "", {})
  if control and all(s in control_runs for s in seeds) and len(seeds) >= 2:
    control_losses = [seed_loss(control_runs[s], rung.iterate) for s in seeds]
    out["vs_control"] = protocol.paired_difference(losses, control_losses, eval_se)
    out["control"] = control
  if rung.name == "R0":
    out["equal_steps"] = equal_steps(
      group, runs, seeds, rung.iterate, arm_ms, base_ms, n, out.get("vs_control"), eval_se
    )
  return out


def equal_steps(
  group: dict[str, Any],
  runs: dict[str, Any],
  seeds: list[str],
  iterate: str,
  arm_ms: dict[str, float] | None,
  base_ms: float | None,
  n: int,
  vs_control: dict[str, Any] | None,
  eval_se: float | None = None,
) -> dict[str, Any]:
  """R0 as the seed measured it: N steps of the arm against N baseline steps, in wall-clock, with the
  final-loss gap at N; beside it the nulls, and the seed's criterion (a speedup at <= 2% gap)."""
  walls, gaps, stop_losses, stop_gaps, stop_walls, losses = [], [], [], [], [], []
  for s in seeds:
    r, base = runs[s], group["baseline"][s]
    at_n = baseline_at(base["steps"], base[iterate], n)
    loss = seed_loss(r, iterate)
    losses.append(loss)
    wall = figures.run_ms(r["step_kinds"], arm_ms)
    walls.append(None if wall is None or base_ms is None else n * base_ms / wall)
    gaps.append((loss - at_n) / at_n)
    # The baseline stopped at the arm's backward passes: its loss there, its gap at N, and its own
    # equal-steps "speedup" (N steps' time over its steps' time).
    stop = baseline_at(base["steps"], base[iterate], r["backward_passes"])
    stop_losses.append(stop)
    stop_gaps.append(None if stop is None else (stop - at_n) / at_n)
    stop_walls.append(n / max(r["backward_passes"], 1))
  present = [w for w in walls if w is not None]
  out: dict[str, Any] = {
    "wallclock_ratio": dict(zip(("mean", "std"), protocol.mean_std(present))) if present else None,
    "wallclock_per_seed": walls,
    "final_loss_gap": dict(zip(("mean", "std"), protocol.mean_std(gaps))) | {"per_seed": gaps},
    "within_2pct": [g <= WITHIN for g in gaps],
    "null_stopped_baseline": {
      "loss": stop_losses,
      "wallclock_ratio": dict(zip(("mean", "std"), protocol.mean_std(stop_walls))),
      "final_loss_gap": stop_gaps,
      "within_2pct": [g is not None and g <= WITHIN for g in stop_gaps],
    },
  }
  if len(seeds) >= 2 and all(x is not None for x in stop_losses):
    out["vs_stopped_baseline"] = protocol.paired_difference(losses, stop_losses, eval_se)
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
  config: ml_collections.ConfigDict, groups: dict[str, Any], ms: dict[str, Any], n: int
) -> dict[str, dict[str, Any]]:
  """Every chosen rung: its condition, and every arm's figures against its baseline (pure: the tests
  recompute it from ladder.json)."""
  defined = arms_lib.arms(config)
  controls = {defined[m].control_of: m for m in defined if defined[m].control_of}
  out = {}
  for name in rungs_of(config):
    rung = RUNGS[name]
    group = groups[rung.group]
    if rung.iterate == "chosen":  # R6: averaged where averaging helped on the tuning seeds, else raw
      rung = dataclasses.replace(rung, iterate=group["tuning"]["iterate"])
    timing_ms = ms.get(timing_key(rung.group))
    arms = [m for m in group["methods"] if not defined[m].control]
    errors = eval_record(groups, rung.group)
    se = None if errors is None else errors.get("paired_se")
    out[name] = {
      **dataclasses.asdict(rung),
      "verdict_rung": name in VERDICT,
      "lr": group["lr"],
      "seeds": group["seeds"],
      "eval": errors,
      "figures": {m: arm_figures(rung, group, m, controls.get(m), timing_ms, n, se) for m in arms},
      "controls": {
        m: arm_figures(rung, group, m, None, timing_ms, n, se) for m in group["methods"] if defined[m].control
      },
    }
  return out


def untuned_position(groups: dict[str, Any], untuned_lr: float) -> dict[str, Any]:
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


def run_ladder(config: ml_collections.ConfigDict, workdir: str, command: str = "") -> dict[str, Any]:
  """The ladder for `config` (`benchmark.ladder_rungs`): trains what its rungs need, times every arm,
  writes ladder.json and ladder.md into `workdir` (and `benchmark.publish`), and re-writes each cosine
  family's protocol results (benchmark.json, headline.json, results.md, plots) under
  `workdir/<family>` and `<publish>/../<preset>-<family>` from the same runs."""
  specs.validate_benchmark(config)
  validate_ladder(config)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  b = config.benchmark
  n = int(config.trainer.steps)
  print(f"ladder {b.preset}: rungs {b.ladder_rungs}, N={n}; workdir {workdir}", flush=True)
  with make_runner(config, workdir) as runner:
    groups = train_all(config, runner)
  print("--- timing (interleaved, this process)", flush=True)
  timed: dict[str, Any] = {}
  adamw = [g for g in ("cosine", "untuned", "constant") if g in groups]
  if adamw:
    all_arms = list(dict.fromkeys(m for g in adamw for m in groups[g]["methods"]))
    g = groups[adamw[0]]
    timed["adamw"] = timing.time_step_kinds(
      group_config(config, adamw[0], g["seeds"]), {"best_lr": g["lr"], "averaging_beta": g["beta"]}, all_arms
    )
  for name in ("muon", "speedrun"):
    if name in groups:
      g = groups[name]
      timed[name] = timing.time_step_kinds(
        group_config(config, name, g["seeds"]), {"best_lr": g["lr"], "averaging_beta": g["beta"]}, g["methods"]
      )
  ms = {k: v["ms_per_step"] for k, v in timed.items()}
  families = {}
  for g in TUNED_GROUPS:
    if g in groups:
      cfg = group_config(config, g, groups[g]["seeds"])
      # The family's headline arm is the protocol's (`benchmark.methods`' first), where it ran.
      ran = names(cfg.benchmark.methods)
      first = [m for m in names(b.methods) if m in ran][:1]
      families[g] = family.family_result(
        cfg,
        groups[g].pop("family_runs"),
        timed[timing_key(g)],
        first + [m for m in ran if m not in first],
        command=command,
        notes=family.task_notes(cfg),
        runner=runner,
      )
  result = {
    "preset": b.preset,
    "task": specs.task_name(config),
    "command": command,
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "machine": report.machine_info(),
    "code_version": keys.code_versions(config, list(arms_lib.arms(config))),
    "config": json.loads(config.to_json()),
    "steps": n,
    "rung_names": rungs_of(config),
    "verdict_rungs": [r for r in VERDICT if r in rungs_of(config)],
    "untuned_lr": float(b.untuned_lr),
    "untuned_position": untuned_position(groups, float(b.untuned_lr)),
    "groups": groups,
    "timing": timed,
    "rungs": rung_figures(config, groups, ms, n),
    "runs_trained": runner.ran,
    "runs_cached": runner.reused,
  }
  result["wall_s"] = time.perf_counter() - t_start
  result["invocations"] = report.earlier_invocations(os.path.join(workdir, f"ladder-{b.preset}.json")) + [
    {"date": result["date"], "wall_s": result["wall_s"], "runs_trained": runner.ran, "runs_cached": runner.reused}
  ]
  write_ladder(result, families, workdir, str(b.publish))
  print("\n" + report.ladder_markdown(result))
  print(f"ladder wall time {result['wall_s']:.0f} s ({runner.ran} runs trained, {runner.reused} cached)", flush=True)
  return result


def join(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
  """One ladder of the same scale from two invocations that ran different rungs (e.g. R6 added to a
  published R0-R5): the groups and timings of both, every rung recomputed from them, the commands in
  order (running both reproduces the result), the compute and code versions of every invocation."""
  for field in ("preset", "task", "steps"):
    if earlier[field] != later[field]:
      raise ValueError(f"cannot join ladders with different {field}: {earlier[field]!r} and {later[field]!r}")
  shared = set(earlier["rung_names"]) & set(later["rung_names"]) | set(earlier["groups"]) & set(later["groups"])
  if shared:
    raise ValueError(f"cannot join ladders that both ran {sorted(shared)}: publish the whole ladder instead")
  out = json.loads(json.dumps(earlier))
  out["rung_names"] = [r for r in RUNGS if r in earlier["rung_names"] + later["rung_names"]]
  out["verdict_rungs"] = [r for r in VERDICT if r in out["rung_names"]]
  out["config"]["benchmark"]["ladder_rungs"] = ",".join(out["rung_names"])
  out["groups"] = {**out["groups"], **later["groups"]}
  out["timing"] = {**out["timing"], **later["timing"]}
  ms = {k: v["ms_per_step"] for k, v in out["timing"].items()}
  out["rungs"] = rung_figures(ml_collections.ConfigDict(out["config"]), out["groups"], ms, out["steps"])
  out["untuned_position"] = untuned_position(out["groups"], float(out["untuned_lr"]))
  out["command"] = f"{earlier['command']}; {later['command']}"
  out["date"] = later["date"]
  for field in ("wall_s", "runs_trained", "runs_cached"):
    out[field] = earlier[field] + later[field]

  def calls(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"rungs": result["rung_names"], "code_version": result["code_version"], **c} for c in result["invocations"]]

  out["invocations"] = calls(earlier) + calls(later)
  return out


def write_ladder(result: dict[str, Any], families: dict[str, Any], workdir: str, publish: str) -> None:
  """ladder-<preset>.json and ladder-<preset>.md into `workdir` and `publish`; each cosine family's
  protocol results into `workdir/<family>` and, published, beside the ladder as `<preset>-<family>`.
  A published ladder of the same scale that ran other rungs (on other runs) is joined with this one
  (`join`); any other is replaced."""
  for folder in [workdir] + ([publish] if publish else []):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"ladder-{result['preset']}.json")
    written = result
    if folder == publish and os.path.exists(path):
      with open(path) as f:
        earlier = json.load(f)
      disjoint = not set(earlier["rung_names"]) & set(result["rung_names"])
      if disjoint and not set(earlier["groups"]) & set(result["groups"]) and earlier["steps"] == result["steps"]:
        written = join(earlier, result)  # else this ladder replaces it, as a whole re-run does
    with open(path, "w") as f:
      json.dump(written, f, indent=1)
    with open(path[: -len(".json")] + ".md", "w") as f:
      f.write(report.ladder_markdown(written) + "\n")
    report.save_ladder_plot(written, folder)
  for fam in families.values():
    fam["wall_s"] = result["wall_s"]
    out = os.path.join(workdir, fam["family"])
    os.makedirs(out, exist_ok=True)
    target = (
      os.path.join(os.path.dirname(os.path.normpath(publish)), f"{fam['preset']}-{fam['family']}") if publish else ""
    )
    fam["plots"] = report.write_results(fam, out, target)
