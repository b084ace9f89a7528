"""Diagnostic: which drift estimate best predicts where the averaged iterate goes next?

  python scripts/drift_forecast.py --config=long                 # tuning seed 1001, its tuned LR
  python scripts/drift_forecast.py --config=quick --every=10 --horizons=5,10 --spans=5   # seconds

A jump moves the params by k r, r the drift per step of the averaged iterate. r can come from two
EMAs of the params (`ema_pair`: r = (EMA_fast - EMA_slow) / (lag_slow - lag_fast), the jump
predictor's estimate, `hybrid.jump.slow_beta`) or from snapshots of the average d steps apart
(`snapshot`: r = (avg_t - avg_{t-d}) / d, which needs a params-sized buffer per snapshot). This
trains the benchmark's anchor run (same step, data order and schedule) and, every `--every` steps,
compares each estimate's forecast r * D with the displacement the average actually makes over the
next D steps, avg_{t+D} - avg_t: the cosine between them and the relative error
|r D - actual| / |actual|, per horizon D. The estimate with the higher cosine and lower error is
the one to keep. Use a tuning seed: a diagnostic that informs the method must not see the headline
seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments import gpt2_small  # noqa: E402
from hybridjax import optim as optim_lib  # noqa: E402
from hybridjax.loop import baseline  # noqa: E402
from hybridjax.methods.jump import steps as jump_lib  # noqa: E402
from scripts.jump_persistence import build_config, parse_ints  # noqa: E402


def flat(tree) -> np.ndarray:
  return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def compare(forecast: np.ndarray, actual: np.ndarray) -> dict[str, float]:
  """Cosine and relative error of a forecast displacement against the actual one."""
  na, nf = np.linalg.norm(actual), np.linalg.norm(forecast)
  cos = float(forecast @ actual / (na * nf)) if na > 0 and nf > 0 else float("nan")
  rel = float(np.linalg.norm(forecast - actual) / na) if na > 0 else float("nan")
  return {"cos": cos, "rel_error": rel, "norm_ratio": float(nf / na) if na > 0 else float("nan")}


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="long")
  p.add_argument("--seed", type=int, default=1001)
  p.add_argument("--lr", type=float, default=None)
  p.add_argument("--steps", type=int, default=None)
  p.add_argument("--every", type=int, default=250, help="forecast points, every this many steps")
  p.add_argument("--horizons", default="50,100,200", help="D: steps ahead the forecast is checked")
  p.add_argument("--spans", default="100,200", help="snapshot estimates: d steps between the snapshots")
  p.add_argument("--slow_betas", default="0.995,0.998", help="ema_pair estimates: the slow EMA's beta")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  t0 = time.perf_counter()
  c = build_config(args.config, args.seed, args.lr, args.steps)
  n = int(c.trainer.steps)
  horizons, spans = parse_ints(args.horizons, "--horizons"), parse_ints(args.spans, "--spans")
  slow_betas = [float(x) for x in args.slow_betas.split(",")]
  fast_beta = float(c.trainer.averaging_beta)

  task = gpt2_small.build_task(c)
  tx = optim_lib.make_optimizer(c.optim)
  step_fn = baseline.make_train_step(task.loss_fn, tx, c.trainer.grad_accum)  # the baseline's own step program
  schedule = optim_lib.make_schedule(c.optim, n)
  params_rng, _ = jax.random.split(jax.random.PRNGKey(c.seed))
  state = optim_lib.init_train_state(task.init_params(params_rng), tx, fast_beta)

  points = [t for t in range(args.every, n, args.every) if t >= max(spans) and t + max(horizons) <= n]
  need_avg = set(points) | {t + d for t in points for d in horizons} | {t - s for t in points for s in spans}
  averages: dict[int, np.ndarray] = {}
  estimates: dict[int, dict[str, np.ndarray]] = {}

  def record(done: int, state, slows) -> None:
    if done in need_avg:
      averages[done] = flat(state.averaging.params)
    if done in points:
      est = {}
      for b, s in zip(slow_betas, slows):
        est[f"ema_pair(slow {b:g})"] = flat(jump_lib.drift_per_step(state.averaging, s, done))
      for s in spans:
        est[f"snapshot(span {s})"] = (averages[done] - averages[done - s]) / s
      estimates[done] = est

  # The anchor run, the slow EMAs as its side averages (bias-corrected like the averaging EMA).
  baseline.run(
    state,
    step_fn,
    train_batch=task.train_batch,
    eval_batches=[],
    eval_fn=None,
    schedule=schedule,
    steps=n,
    side_betas=slow_betas,
    on_step=record,
  )

  rows = []
  for t in points:
    for d in horizons:
      actual = averages[t + d] - averages[t]
      for name, r in estimates[t].items():
        rows.append({"step": t, "horizon": d, "estimate": name, **compare(r * d, actual)})
  names = list(estimates[points[0]])
  summary = {
    name: {
      str(d): {
        k: float(np.mean([r[k] for r in rows if r["estimate"] == name and r["horizon"] == d]))
        for k in ("cos", "rel_error", "norm_ratio")
      }
      for d in horizons
    }
    for name in names
  }
  print(f"drift forecast: {args.config}, seed {c.seed}, lr {c.optim.learning_rate:g}, N {n}, {len(points)} points")
  print(f"  {'estimate':<24} " + " ".join(f"{'D=' + str(d) + ' cos/err/|f|:|a|':>26}" for d in horizons))
  for name in names:
    cells = " ".join(
      f"{summary[name][str(d)]['cos']:>8.3f} {summary[name][str(d)]['rel_error']:>7.3f} "
      f"{summary[name][str(d)]['norm_ratio']:>7.3f}  "
      for d in horizons
    )
    print(f"  {name:<24} {cells}")
  result = {
    "config": args.config,
    "seed": c.seed,
    "lr": float(c.optim.learning_rate),
    "points": points,
    "rows": rows,
    "summary": summary,
    "seconds": time.perf_counter() - t0,
  }
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == "__main__":
  main()
