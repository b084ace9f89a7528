"""Diagnostic: how does the held-out loss change along the velocity, at points of a real run?

  python scripts/line_scan.py [--preset tiny] [--at 150,300,450] [--alphas=-8,-4,-2,-1,0,1,2,4,8,16]
                             [--velocity_beta 0.99] [--averaging_beta 0.99] [--out scan.json]

Trains the preset as `train` does, from the same initial params, with real steps only (hybrid with
`enable_predict=False`, which is bit-exact with the baseline and also keeps the velocity), and at
each step in `--at` evaluates the fixed held-out batches at theta + a * velocity for every a in
`--alphas`, next to the loss after the same number of further *real* steps. This measures what a
predicted step can gain at best there (one alpha for all groups), independent of the RSSM and the
controller. Negative alphas (pass them as `--alphas=-8,...`, with the `=`) step back along the
velocity: a minimum at a < 0 says the velocity overshoots.

The run also keeps the params' moving average (`trainer.averaging='ema'` at `--averaging_beta`), the
averaged anchor: at each point the scan also reports the held-out loss of the averaged params,
the loss along the velocity from them (theta_avg + a * velocity), and the average after k further
real steps. `main` returns all of it as a dict (and `--out` writes it as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments import gpt2_small  # noqa: E402
from experiments.configs import gpt2_small as gpt2_cfg  # noqa: E402
from hybridjax.hybrid import groups as groups_lib  # noqa: E402
from hybridjax.hybrid import step as step_lib  # noqa: E402
from hybridjax.hybrid.phases import Branch  # noqa: E402
from hybridjax.loop import train as train_lib  # noqa: E402


def parse_alphas(spec: str) -> list[float]:
  """'-8,-4,0,1,2' -> [-8.0, -4.0, 0.0, 1.0, 2.0] (sorted, distinct)."""
  try:
    alphas = sorted({float(a) for a in spec.split(",") if a.strip()})
  except ValueError:
    raise ValueError(f"--alphas: expected a comma list of numbers, got {spec!r}") from None
  if not alphas:
    raise ValueError("--alphas: give at least one alpha")
  return alphas


def _row(label: str, values) -> str:
  cells = "".join(f"{x:>9.4f}" if x is not None and np.isfinite(x) else f"{'-':>9}" for x in values)
  return f"  {label:<18}" + cells


def main(argv=None) -> dict:
  """Runs the scan, prints a table per point and returns the results (JSON-able)."""
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", default="tiny")
  ap.add_argument("--at", default="150,300,450")
  ap.add_argument("--alphas", default="-8,-4,-2,-1,0,1,2,4,8,16", help="negatives as --alphas=-8,-4,...")
  ap.add_argument("--velocity_beta", type=float, default=0.99)
  ap.add_argument("--averaging_beta", type=float, default=0.99)
  ap.add_argument("--out", default="", help="write the results as JSON here")
  args = ap.parse_args(argv)
  at = sorted(int(s) for s in args.at.split(","))
  alphas = parse_alphas(args.alphas)
  c = gpt2_cfg.get_config(args.preset)
  c.mode = "hybrid"
  c.hybrid.enable_predict = False  # every step a full step: the baseline's trajectory, plus the velocity
  c.hybrid.velocity.beta = args.velocity_beta
  c.trainer.averaging = "ema"  # the averaged anchor; the raw trajectory is unchanged
  c.trainer.averaging_beta = args.averaging_beta
  task = gpt2_small.build_task(c)
  # The driver `train` uses: the same initial params, schedule and velocity bookkeeping.
  driver = train_lib.make_driver(c, init_params=task.init_params, loss_fn=task.loss_fn)
  ctx, schedule = driver.ctx, driver.schedule
  state = driver.init_state()
  full_step = jax.jit(step_lib.make_phase_step(ctx, Branch.FULL_STEP), donate_argnums=0)
  step_fn = lambda s, b: full_step(s, b, schedule)  # noqa: E731
  eval_fn = train_lib.make_eval_fn(task.loss_fn)
  move = jax.jit(
    lambda p, v, a: groups_lib.add_scaled_by_group(ctx.groups, p, a * np.ones(ctx.groups.n_groups, np.float32), v)
  )
  evaluate = lambda p: train_lib.evaluate(eval_fn, p, task.eval_batches)  # noqa: E731

  # Real steps: k = a for every non-negative integer a.
  ks = [int(a) for a in alphas if a >= 0 and a == int(a)]
  kmax = max(ks, default=0)
  print(
    f"preset {args.preset}, velocity_beta {args.velocity_beta}, averaging_beta {args.averaging_beta}; eval loss "
    f"at theta + a*v and theta_avg + a*v (a = {alphas}) vs after k further real steps (k = a)"
  )
  points = []
  step = 0
  for target in at:
    while step < target:
      state, _ = step_fn(state, task.train_batch(step))
      step += 1
    p0 = jax.device_get(state.train.params)
    avg0 = jax.device_get(state.train.averaging.params)
    v = jax.device_get(state.method.velocity)
    along = [evaluate(move(p0, v, a)) for a in alphas]
    along_avg = [evaluate(move(avg0, v, a)) for a in alphas]
    # The same number of real steps from here, on a copy (the run itself continues from `state`).
    ref = jax.tree.map(np.copy, jax.device_get(state))
    real = {0: evaluate(p0)}
    real_avg = {0: evaluate(avg0)}
    s = jax.device_put(ref)
    for k in range(1, kmax + 1):
      s, _ = step_fn(s, task.train_batch(step + k - 1))
      if k in ks:
        real[k] = evaluate(s.train.params)
        real_avg[k] = evaluate(s.train.averaging.params)
    vnorm = float(np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(v))))
    row_real = [real.get(int(a)) if a in ks else None for a in alphas]
    row_real_avg = [real_avg.get(int(a)) if a in ks else None for a in alphas]
    print(f"step {target}: |v| = {vnorm:.4f}; eval loss raw {real[0]:.4f}, averaged {real_avg[0]:.4f}")
    print(f"  {'a / k':<18}" + "".join(f"{a:>9g}" for a in alphas))
    print(_row("along v", along))
    print(_row("real steps", row_real))
    print(_row("avg + a*v", along_avg))
    print(_row("avg, real steps", row_real_avg))
    points.append(
      {
        "step": target,
        "velocity_norm": vnorm,
        "raw": real[0],
        "averaged": real_avg[0],
        "along_v": along,
        "real_steps": row_real,
        "averaged_along_v": along_avg,
        "averaged_real_steps": row_real_avg,
      }
    )
  result = {
    "preset": args.preset,
    "velocity_beta": args.velocity_beta,
    "averaging_beta": args.averaging_beta,
    "alphas": alphas,
    "points": points,
  }
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1, default=lambda x: None)
    print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
