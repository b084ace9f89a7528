"""The tuning: the LR sweep on the tuning seeds, the averaging beta, the budget checks; then the budget
curves on the headline seeds and the method arms at the tuned LR and beta.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from hybridjax.bench.figures import paired_batch_se_of, plateau_runs, window_error
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.specs import run_spec
from hybridjax.bench.studies import Config, Record


def lr_grid(center: float, points: int) -> list[float]:
  """`points` learning rates on a sqrt(2) grid centred on `center`."""
  lo = -(points // 2)
  return [round_lr(center * math.sqrt(2) ** (lo + i)) for i in range(points)]


def round_lr(lr: float) -> float:
  return float(f"{lr:.4g}")


def averaged_loss(result: Record, beta: float | None = None) -> float:
  """A tuning run's best averaged loss over its betas, or its loss at `beta`."""
  if beta is None:
    return min(result["final_averaged"].values())
  return result["final_averaged"][str(float(beta))]


def paired_eval_error(
  a: list[Record], b: list[Record], differences: list[float], averaged: bool = True
) -> tuple[float | None, int | None]:
  """(the eval error a paired difference of anchor runs a - b is judged with, its windows): per seed the
  two runs a[i], b[i]; the windows' error of the seed-averaged difference (`figures.window_error`), else
  the mean over the seeds of the two runs' paired per-batch standard error (`paired_batch_se_of`);
  (None, None) where a side is read raw (`averaged` False: the runs keep the averaged iterate's
  per-window losses only) or no run kept them."""
  if not averaged:
    return None, None
  own = window_error(a, b, differences)
  if own is not None:
    return own
  ses = [paired_batch_se_of(x, y) for x, y in zip(a, b)]
  if not ses or None in ses:
    return None, None
  return sum(ses) / len(ses), len(a[0]["final_averaged_per_batch"])


def difference_noise(tuning_losses: list[float], a: Record, b: Record) -> Record:
  """The noise of a difference of two final losses, which the budget checks judge two LRs' runs by.

  The two tuning seeds' spread at the chosen LR and beta (`tuning_losses`, one loss per tuning seed,
  over sqrt(2)), never less than the eval set's sampling error of such a difference (two seeds can agree
  by chance): the paired per-batch standard error of runs `a` and `b` (the best two LRs on the first
  tuning seed, scored on the same batches). Not one loss's sampling error: the batches' difficulty is
  common to both runs and cancels. One eval batch cannot estimate it: the seeds' spread alone is the
  noise then, and `eval_paired_se` is None.

  Returns:
    {"noise", "seed_spread", "eval_paired_se"}.
  """
  spread = abs(tuning_losses[0] - tuning_losses[1]) / math.sqrt(2)
  paired = paired_batch_se_of(a, b)
  return {"noise": max(spread, paired or 0.0), "seed_spread": spread, "eval_paired_se": paired}


def wins_beyond_noise(new: list[float], old: list[float]) -> Record:
  """Whether `new` beats `old` by more than the noise of their difference: per seed (paired, the same seeds
  in the same order) new - old; the mean difference below minus its standard error (the differences' sd
  over sqrt(seeds)). Fewer than two seeds cannot tell the noise: no win.

  Returns:
    {"difference": the mean difference, "se": its standard error (None under two seeds), "wins"}.
  """
  d = [a - b for a, b in zip(new, old)]
  if len(d) < 2:
    return {"difference": statistics.fmean(d) if d else None, "se": None, "wins": False}
  mean, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))
  return {"difference": mean, "se": se, "wins": -mean > se}


def budget_candidates(lr: float, weight_decay: float, factor: float) -> list[dict[str, float]]:
  """The settings a budget's check tries at T = `factor` x N, the chosen one first: the LR at its sqrt(2)
  neighbours, and the weight decay lambda at lambda N / T (the decay summed over the run the same as at N),
  where lambda > 0."""
  out = [{"lr": x, "weight_decay": weight_decay} for x in (lr, *lr_grid(lr, 3)[::2])]
  if weight_decay > 0:
    out.append({"lr": lr, "weight_decay": round_lr(weight_decay / factor)})
  return out


BUDGET_RULE = (
  "at every budget but N, the LR's sqrt(2) neighbours and the weight decay lambda N / T tried on the tuning "
  "seeds; the chosen setting kept unless the lowest mean beats it by more than the paired noise of the "
  "difference (its mean below minus its standard error over the seeds)"
)


def budget_choice(tried: list[Record]) -> Record:
  """`BUDGET_RULE`'s choice among `tried` (`budget_candidates`' settings, the chosen one first, each with
  its "losses" on the tuning seeds, in the same order): {"chosen": {"lr", "weight_decay"} of the one kept,
  "best_difference": the best candidate's paired difference from the first (`wins_beyond_noise`)}."""
  best = min(tried, key=lambda t: statistics.fmean(t["losses"]))
  win = wins_beyond_noise(best["losses"], tried[0]["losses"])
  kept = best if win["wins"] else tried[0]
  return {"chosen": {"lr": kept["lr"], "weight_decay": kept["weight_decay"]}, "best_difference": win}


def iterate_loss(run: Record, iterate: str, beta: float) -> float:
  """A run's loss as read: its raw iterate's, or its averaged one's at `beta`."""
  return run["final_raw"] if iterate == "raw" else averaged_loss(run, beta)


def best_loss(result: Record) -> float:
  """A run's better iterate: the lower of its raw and its best averaged loss."""
  return min(result["final_raw"], averaged_loss(result))


Sweep = tuple[Config, Callable[[int, float, int], Record], Callable[[Record], float]]
"""One LR sweep's (benchmark config, spec(seed, lr, steps) -> run spec, loss(run) -> float to rank by)."""


def _at_n(sweep: Sweep, seed: int, lr: float) -> Record:
  """The spec of `sweep`'s N-step run at `lr` on its `seed`-th tuning seed."""
  config, spec, _ = sweep
  return spec(int(config.benchmark.tuning_seeds[seed]), lr, int(config.trainer.steps))


def sweep_lrs(sweeps: list[Sweep], runner: Runner) -> list[Record]:
  """The LR sweep of each of `sweeps`: `benchmark.lr_points` LRs on a sqrt(2) grid around
  `optim.learning_rate` on the first tuning seed at N, extended while the best (lowest `loss(run)`)
  sits at an edge; then the best two on the second tuning seed, the better mean over both seeds
  winning. The sweeps run in lockstep: each stage's runs of every sweep in one batch, so the workers
  never wait on one sweep's extension. Each sweep's record keeps its runs at the best LR on both seeds
  (`at_best`, which `choose_averaging` reads)."""
  grids = [lr_grid(float(c.optim.learning_rate), int(c.benchmark.lr_points)) for c, _, _ in sweeps]
  first = iter(
    runner.run([_at_n(s, 0, lr) for s, grid in zip(sweeps, grids) for lr in grid], "LR sweep (tuning seed 1, N)")
  )
  runs = [{lr: next(first) for lr in grid} for grid in grids]  # LR -> its run on the first tuning seed
  for _ in range(max(int(c.benchmark.lr_max_extensions) for c, _, _ in sweeps)):
    extend = []  # (sweep, the LR past its grid's edge)
    for i, (config, _, loss) in enumerate(sweeps):
      grid = sorted(runs[i])
      best = min(grid, key=lambda lr: loss(runs[i][lr]))
      extended = len(grid) - int(config.benchmark.lr_points)  # the extensions so far
      if grid[0] < best < grid[-1] or extended >= int(config.benchmark.lr_max_extensions):
        continue
      extend.append((i, round_lr(best / math.sqrt(2) if best == grid[0] else best * math.sqrt(2))))
    if not extend:
      break
    added = runner.run(
      [_at_n(sweeps[i], 0, lr) for i, lr in extend], "LR sweep: the best LR is at the grid's edge; extending"
    )
    for (i, lr), result in zip(extend, added):
      runs[i][lr] = result
  out = []
  for (config, _, loss), ran in zip(sweeps, runs):
    grid = sorted(ran)
    top2 = sorted(grid, key=lambda lr: loss(ran[lr]))[:2]
    edge = top2[0] in (grid[0], grid[-1])
    if edge:
      print(
        f"WARNING: the best LR {top2[0]:.4g} is still at the grid's edge after "
        f"{config.benchmark.lr_max_extensions} extensions; raise --config.benchmark.lr_max_extensions or move "
        "--config.optim.learning_rate towards it",
        flush=True,
      )
    out.append({"grid": grid, "sweep": [ran[lr] for lr in grid], "top2": top2, "best_at_edge": edge})
  second = iter(
    runner.run([_at_n(s, 1, lr) for s, o in zip(sweeps, out) for lr in o["top2"]], "LR check (tuning seed 2, N)")
  )
  for (_, _, loss), o, ran in zip(sweeps, out, runs):
    at = {lr: [ran[lr], next(second)] for lr in o["top2"]}  # on both tuning seeds
    means = {lr: (loss(a) + loss(b)) / 2 for lr, (a, b) in at.items()}
    best_lr = min(means, key=means.get)
    o.update(second=[b for _, b in at.values()], means=means, best_lr=best_lr, at_best=at[best_lr])
  return out


def choose_averaging(at_best: list[Record], betas: Sequence[float]) -> Record:
  """The averaging beta of runs at one LR (the lowest mean averaged loss over them) and whether
  averaging helps there: the raw and the averaged loss at that beta, mean over the runs, and the
  lower of the two ('iterate': what a family with `benchmark.iterate='best'` reads; 'raw' on a tie)."""
  betas = [float(x) for x in betas]  # a config's `benchmark.betas`, say
  table = {str(x): [averaged_loss(r, x) for r in at_best] for x in betas}
  beta = min(betas, key=lambda x: statistics.fmean(table[str(x)]))
  losses = {"raw": statistics.fmean(r["final_raw"] for r in at_best), "averaged": statistics.fmean(table[str(beta)])}
  return {"beta": beta, "beta_table": table, "iterate_losses": losses, "iterate": min(losses, key=losses.get)}


def tune(
  config: Config,
  runner: Runner,
  also: Callable[[float, float], list[Record]],
) -> Record:
  """The LR sweep, the second-seed check, the averaging beta and the budget checks.

  `also(best_lr, beta)`: runs to train together with the budget checks, once the LR and beta are
  known (the benchmark passes the budget curves at the chosen LR and the method arms, so the worker
  processes never wait for the checks; a budget whose LR the checks move is trained afterwards).
  """
  b = config.benchmark
  n, spec = int(config.trainer.steps), spec_of(config)
  # 1-2. The sweep on the first tuning seed at N, the best two on the second, ranked by the averaged
  # loss (the best over the betas: the headline anchor averages), or with `benchmark.iterate='best'`
  # by the better of the raw and the averaged loss (a family whose schedule may not gain from
  # averaging: its headline reads whichever iterate the tuning seeds chose).
  ranked_by = best_loss if b.get("iterate", "averaged") == "best" else averaged_loss
  swept = sweep_lrs([(config, spec, ranked_by)], runner)[0]
  grid, sweep, top2, best_lr = swept["grid"], swept["sweep"], swept["top2"], swept["best_lr"]
  # 3. The averaging beta and whether averaging helps, on both tuning seeds at the chosen LR.
  averaging = choose_averaging(swept["at_best"], b.betas)
  beta, beta_table = averaging["beta"], averaging["beta_table"]
  noise = difference_noise(beta_table[str(beta)], *(sweep[grid.index(lr)] for lr in top2))

  def row(r: Record) -> Record:
    return {
      "lr": r["lr"],
      "seed": r["seed"],
      "budget": r["steps"],
      "loss_raw": r["final_raw"],
      "loss_averaged": averaged_loss(r, beta),
    }

  rows = [row(r) | {"loss_averaged_by_beta": r["final_averaged"]} for r in sweep + swept["second"]]
  # 4. The best LR and its neighbours at 0.5N and 2N (first tuning seed).
  checks: Record = {}
  per_budget_lr = {str(float(f)): best_lr for f in b.budgets}  # keys: '0.5', '1.0', ...
  lrs = lr_grid(best_lr, 3)
  checked = iter(
    runner.run(
      [spec(int(b.tuning_seeds[0]), lr, round(factor * n)) for factor in (0.5, 2.0) for lr in lrs]
      + also(best_lr, beta),
      "LR checks at 0.5N and 2N, and the runs at the chosen LR",
    )
  )
  for factor in (0.5, 2.0):
    res = [row(next(checked)) for _ in lrs]
    rows += res
    losses = {x["lr"]: x["loss_averaged"] for x in res}
    winner = min(losses, key=losses.get)
    moved = winner != best_lr and losses[best_lr] - losses[winner] > 2 * noise["noise"]
    checks[str(factor)] = {
      "lrs": lrs,
      "averaged_loss": list(losses.values()),
      "raw_loss": [x["loss_raw"] for x in res],
      "winner": winner,
      "wins_beyond_noise": moved,
    }
    if moved:  # this budget and its neighbour on the same side of N use the winner
      per_budget_lr.update({str(float(f)): winner for f in b.budgets if (f <= 0.75 if factor < 1 else f >= 1.5)})
  return {
    "grid": grid,
    "rows": rows,
    "best_two": top2,
    "best_two_means": {str(k): v for k, v in swept["means"].items()},
    "best_lr": best_lr,
    "best_lr_for_raw_loss": min(grid, key=lambda lr: sweep[grid.index(lr)]["final_raw"]),
    "best_at_edge": swept["best_at_edge"],
    "averaging_beta": beta,
    "beta_table": beta_table,
    "iterate_losses": averaging["iterate_losses"],
    "iterate": averaging["iterate"],
    "seed_noise": noise["noise"],
    "seed_spread": noise["seed_spread"],
    "eval_paired_se": noise["eval_paired_se"],
    "budget_checks": checks,
    "per_budget_lr": per_budget_lr,
  }


def curve_specs(config: Config, lr_of: Callable[[float], float], beta: float) -> list[dict]:
  """The budget curves' runs: every headline seed at every budget factor f, at LR `lr_of(f)`."""
  n = int(config.trainer.steps)
  return [
    run_spec(config, kind="anchor", seed=int(s), lr=lr_of(float(f)), steps=round(float(f) * n), beta=beta)
    for s in config.benchmark.seeds
    for f in sorted(config.benchmark.budgets)
  ]


def budget_curves(config: Config, runner: Runner, tuning: Record) -> Record:
  """The raw and averaged anchors: every headline seed at every budget, each its own schedule."""
  n = int(config.trainer.steps)
  factors = [float(f) for f in sorted(config.benchmark.budgets)]
  specs = curve_specs(config, lambda f: tuning["per_budget_lr"][str(f)], tuning["averaging_beta"])
  results = runner.run(specs, "budget curves (headline seeds)")
  budgets = [round(f * n) for f in factors]
  curves: dict[str, dict[str, list[float]]] = {"baseline": {}, "averaged_baseline": {}}
  for r in results:
    averaged = averaged_loss(r, tuning["averaging_beta"])
    for anchor, loss in (("baseline", r["final_raw"]), ("averaged_baseline", averaged)):
      curves[anchor].setdefault(str(r["seed"]), [None] * len(budgets))[budgets.index(r["steps"])] = loss
  runs = {f"{r['seed']}/{r['steps']}": r for r in results}
  return {"factors": factors, "budgets": budgets, "curves": curves, "runs": runs}


def method_specs(config: Config, methods: list[str], lr: float, beta: float) -> list[dict]:
  """Every method arm on every headline seed, N steps at the chosen LR and beta."""
  n = int(config.trainer.steps)
  return [
    run_spec(config, kind="method", seed=int(s), lr=lr, steps=n, beta=beta, method=m)
    for m in methods
    for s in config.benchmark.seeds
  ]


def method_runs(config: Config, runner: Runner, tuning: Record, methods: list[str]) -> dict[str, Record]:
  specs = method_specs(config, methods, tuning["best_lr"], tuning["averaging_beta"])
  results = runner.run(specs, "method arms (headline seeds)") if specs else []
  return {m: {str(r["seed"]): r for r in results if r["method"] == m} for m in methods}


def spec_of(c: Config) -> Callable[[int, float, int], Record]:
  """An anchor run's spec(seed, lr, steps) of `c`, recording every averaging beta of `benchmark.betas`."""
  betas = [float(x) for x in c.benchmark.betas]
  return lambda seed, lr, steps: run_spec(c, kind="anchor", seed=seed, lr=lr, steps=steps, beta=betas[0], betas=betas)


def train_steps(
  configs: dict[str, Config],
  config: Config,
  runner: Runner,
  label: str = "recipe steps (headline seeds, N)",
) -> dict[str, Record]:
  """Each of `configs` tuned as a recipe step is (its LR sweep on the tuning seeds, all sweeps in
  lockstep; its averaging beta and iterate) and run N steps at its best LR on the headline seeds
  (`config`'s), each headline run flagged by the plateau rule."""
  swept = sweep_lrs([(c, spec_of(c), best_loss) for c in configs.values()], runner)
  chosen = {}
  for (name, c), sw in zip(configs.items(), swept):
    averaging = choose_averaging(sw["at_best"], c.benchmark.betas)
    chosen[name] = {k: averaging[k] for k in ("beta", "iterate", "iterate_losses")} | {
      "lr": sw["best_lr"],
      "grid": sw["grid"],
      "best_at_edge": sw["best_at_edge"],
      "sweep_loss": [best_loss(r) for r in sw["sweep"]],
    }
  n, seeds = int(config.trainer.steps), [int(s) for s in config.benchmark.seeds]
  headline = [
    run_spec(c, kind="anchor", seed=s, lr=chosen[name]["lr"], steps=n, beta=chosen[name]["beta"])
    for name, c in configs.items()
    for s in seeds
  ]
  results = iter(runner.run(headline, label))
  out = {}
  for name, ch in chosen.items():
    runs = [next(results) for _ in seeds]
    curves = {name: {str(r["seed"]): r["curve"] for r in runs}}
    out[name] = ch | {
      "plateaus": plateau_runs(curves, n, float(config.benchmark.plateau_margin)),
      "runs": {
        str(r["seed"]): {
          **{k: r[k] for k in ("final_raw", "final_averaged", "final_averaged_per_batch") if k in r},
          "loss": iterate_loss(r, ch["iterate"], ch["beta"]),
          "key": r.get("key"),
        }
        for r in runs
      },
    }
  return out
