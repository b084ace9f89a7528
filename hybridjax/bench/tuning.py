"""The tuning: the LR sweep on the tuning seeds, the averaging beta, the budget checks; then the budget
curves on the headline seeds and the method arms at the tuned LR and beta.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

import ml_collections

from hybridjax.bench.runner import Runner
from hybridjax.bench.specs import run_spec


def lr_grid(center: float, points: int) -> list[float]:
  """`points` learning rates on a sqrt(2) grid centred on `center`."""
  lo = -(points // 2)
  return [round_lr(center * math.sqrt(2) ** (lo + i)) for i in range(points)]


def round_lr(lr: float) -> float:
  return float(f"{lr:.4g}")


def averaged_loss(result: dict[str, Any], beta: float | None = None) -> float:
  """A tuning run's best averaged loss over its betas, or its loss at `beta`."""
  if beta is None:
    return min(result["final_averaged"].values())
  return result["final_averaged"][str(float(beta))]


def tune(
  config: ml_collections.ConfigDict,
  runner: Runner,
  also: Callable[[float, float], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
  """The LR sweep, the second-seed check, the averaging beta and the budget checks.

  `also(best_lr, beta)`: runs to train together with the budget checks, once the LR and beta are
  known (the benchmark passes the budget curves at the chosen LR and the method arms, so the worker
  processes never wait for the checks; a budget whose LR the checks move is trained afterwards).
  """
  b = config.benchmark
  n = int(config.trainer.steps)
  t1, t2 = (int(s) for s in b.tuning_seeds)
  betas = [float(x) for x in b.betas]
  beta0 = betas[0]

  def spec(seed, lr, steps):
    return run_spec(config, kind="anchor", seed=seed, lr=lr, steps=steps, beta=beta0, betas=betas)

  # 1. The sweep on the first tuning seed at N; extended while the best is at an edge. LRs are
  # ranked by the averaged loss (the best over the betas): the headline anchor averages.
  grid = lr_grid(float(config.optim.learning_rate), int(b.lr_points))
  sweep = runner.run([spec(t1, lr, n) for lr in grid], "LR sweep (tuning seed 1, N)")
  for _ in range(int(b.lr_max_extensions)):
    best = min(range(len(grid)), key=lambda i: averaged_loss(sweep[i]))
    if 0 < best < len(grid) - 1:
      break
    new = round_lr(grid[0] / math.sqrt(2) if best == 0 else grid[-1] * math.sqrt(2))
    result = runner.run([spec(t1, new, n)], "LR sweep: the best LR is at the grid's edge; extending")[0]
    grid, sweep = ([new] + grid, [result] + sweep) if best == 0 else (grid + [new], sweep + [result])
  ranked = sorted(range(len(grid)), key=lambda i: averaged_loss(sweep[i]))
  best_at_edge = ranked[0] in (0, len(grid) - 1)
  if best_at_edge:
    print(
      f"WARNING: the best LR {grid[ranked[0]]:.4g} is still at the grid's edge after "
      f"{b.lr_max_extensions} extensions; raise --config.benchmark.lr_max_extensions or move "
      "--config.optim.learning_rate towards it",
      flush=True,
    )
  top2 = [grid[i] for i in ranked[:2]]
  # 2. The best two on the second tuning seed; the better mean over both seeds wins.
  second = runner.run([spec(t2, lr, n) for lr in top2], "LR check (tuning seed 2, N)")
  means = {lr: (averaged_loss(sweep[grid.index(lr)]) + averaged_loss(r)) / 2 for lr, r in zip(top2, second)}
  best_lr = min(means, key=means.get)
  # 3. The averaging beta: the best mean over both tuning seeds at the chosen LR.
  at_best = [sweep[grid.index(best_lr)], second[top2.index(best_lr)]]
  beta_table = {str(x): [averaged_loss(r, x) for r in at_best] for x in betas}
  beta = min(betas, key=lambda x: statistics.fmean(beta_table[str(x)]))
  # The noise of one final loss: the two tuning seeds' spread at the chosen LR and beta, and never
  # less than the eval set's sampling error (two seeds can agree by chance).
  sampling = max(r["eval_batch_std"] / math.sqrt(r["eval_batches"]) for r in at_best)
  noise = max(abs(beta_table[str(beta)][0] - beta_table[str(beta)][1]) / math.sqrt(2), sampling)
  # 4. The best LR and its neighbours at 0.5N and 2N (first tuning seed).
  checks: dict[str, Any] = {}
  per_budget_lr = {str(float(f)): best_lr for f in b.budgets}  # keys: '0.5', '1.0', ...
  neighbours = [round_lr(best_lr / math.sqrt(2)), best_lr, round_lr(best_lr * math.sqrt(2))]
  check_specs = [spec(t1, lr, round(factor * n)) for factor in (0.5, 2.0) for lr in neighbours]
  checked = runner.run(
    check_specs + (also(best_lr, beta) if also else []), "LR checks at 0.5N and 2N, and the runs at the chosen LR"
  )
  for k, factor in enumerate((0.5, 2.0)):
    lrs = neighbours
    res = checked[k * len(lrs) : (k + 1) * len(lrs)]
    losses = {lr: averaged_loss(r, beta) for lr, r in zip(lrs, res)}
    winner = min(losses, key=losses.get)
    moved = winner != best_lr and losses[best_lr] - losses[winner] > 2 * noise
    checks[str(factor)] = {
      "lrs": lrs,
      "averaged_loss": [losses[lr] for lr in lrs],
      "raw_loss": [r["final_raw"] for r in res],
      "winner": winner,
      "wins_beyond_noise": moved,
    }
    if moved:  # this budget and its neighbour on the same side of N use the winner
      for f in b.budgets:
        if (factor < 1 and f <= 0.75) or (factor > 1 and f >= 1.5):
          per_budget_lr[str(float(f))] = winner
  all_runs = sweep + second  # the budget checks' runs are in `checks`
  rows = [
    {
      "lr": r["lr"],
      "seed": r["seed"],
      "budget": r["steps"],
      "loss_raw": r["final_raw"],
      "loss_averaged": averaged_loss(r, beta),
      "loss_averaged_by_beta": r["final_averaged"],
    }
    for r in all_runs
  ]
  for factor, chk in checks.items():
    for lr, avg, raw in zip(chk["lrs"], chk["averaged_loss"], chk["raw_loss"]):
      rows.append({"lr": lr, "seed": t1, "budget": round(float(factor) * n), "loss_raw": raw, "loss_averaged": avg})
  raw_best_lr = min(grid, key=lambda lr: sweep[grid.index(lr)]["final_raw"])
  return {
    "grid": grid,
    "rows": rows,
    "best_two": top2,
    "best_two_means": {str(k): v for k, v in means.items()},
    "best_lr": best_lr,
    "best_lr_for_raw_loss": raw_best_lr,
    "best_at_edge": best_at_edge,
    "averaging_beta": beta,
    "beta_table": beta_table,
    "seed_noise": noise,
    "budget_checks": checks,
    "per_budget_lr": per_budget_lr,
  }


def curve_specs(config: ml_collections.ConfigDict, lr_of: Callable[[float], float], beta: float) -> list[dict]:
  """The budget curves' runs: every headline seed at every budget factor f, at LR `lr_of(f)`."""
  n = int(config.trainer.steps)
  return [
    run_spec(config, kind="anchor", seed=int(s), lr=lr_of(float(f)), steps=round(float(f) * n), beta=beta)
    for s in config.benchmark.seeds
    for f in sorted(config.benchmark.budgets)
  ]


def budget_curves(config: ml_collections.ConfigDict, runner: Runner, tuning: dict[str, Any]) -> dict[str, Any]:
  """The raw and averaged anchors: every headline seed at every budget, each its own schedule."""
  n = int(config.trainer.steps)
  b = config.benchmark
  factors = [float(f) for f in sorted(b.budgets)]
  specs = curve_specs(config, lambda f: tuning["per_budget_lr"][str(float(f))], tuning["averaging_beta"])
  results = runner.run(specs, "budget curves (headline seeds)")
  budgets = [round(f * n) for f in factors]
  curves: dict[str, dict[str, list[float]]] = {"baseline": {}, "averaged_baseline": {}}
  runs = {}
  for r in results:
    s = str(r["seed"])
    curves["baseline"].setdefault(s, [None] * len(budgets))[budgets.index(r["steps"])] = r["final_raw"]
    curves["averaged_baseline"].setdefault(s, [None] * len(budgets))[budgets.index(r["steps"])] = averaged_loss(
      r, tuning["averaging_beta"]
    )
    runs[f"{s}/{r['steps']}"] = r
  return {"factors": factors, "budgets": budgets, "curves": curves, "runs": runs}


def method_specs(config: ml_collections.ConfigDict, methods: list[str], lr: float, beta: float) -> list[dict]:
  """Every method arm on every headline seed, N steps at the chosen LR and beta."""
  n = int(config.trainer.steps)
  return [
    run_spec(config, kind="method", seed=int(s), lr=lr, steps=n, beta=beta, method=m)
    for m in methods
    for s in config.benchmark.seeds
  ]


def method_runs(
  config: ml_collections.ConfigDict, runner: Runner, tuning: dict[str, Any], methods: list[str]
) -> dict[str, dict[str, Any]]:
  specs = method_specs(config, methods, tuning["best_lr"], tuning["averaging_beta"])
  results = runner.run(specs, "method arms (headline seeds)") if specs else []
  out: dict[str, dict[str, Any]] = {m: {} for m in methods}
  for r in results:
    out[r["method"]][str(r["seed"])] = r
  return out
