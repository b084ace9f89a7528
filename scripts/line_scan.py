"""Diagnostic: how does the held-out loss change along the velocity, at points of a real run?

  python scripts/line_scan.py [--preset tiny] [--at 150,300,450] [--alphas 0,1,2,4,8,16]
                             [--velocity_beta 0.99]

Trains the preset as `train` does, from the same initial params, with real steps only (hybrid with
`enable_predict=False`, which is bit-exact with the baseline and also keeps the velocity), and at
each step in `--at` evaluates the fixed held-out batches at theta + a * velocity for every a in
`--alphas`, next to the loss after the same number of further *real* steps. This measures what a
predicted step can gain at best there (one alpha for all groups), independent of the RSSM and the
controller.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments import gpt2_small  # noqa: E402
from experiments.configs import gpt2_small as gpt2_cfg  # noqa: E402
from hybridjax.hybrid import features as features_lib  # noqa: E402
from hybridjax.hybrid import step as step_lib  # noqa: E402
from hybridjax.hybrid.phases import Branch  # noqa: E402
from hybridjax.loop import train as train_lib  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", default="tiny")
  ap.add_argument("--at", default="150,300,450")
  ap.add_argument("--alphas", default="0,1,2,4,8,16")
  ap.add_argument("--velocity_beta", type=float, default=0.99)
  args = ap.parse_args(argv)
  at = sorted(int(s) for s in args.at.split(","))
  alphas = [float(a) for a in args.alphas.split(",")]
  c = gpt2_cfg.get_config(args.preset)
  c.mode = "hybrid"
  c.hybrid.enable_predict = False  # every step a full step: the baseline's trajectory, plus the velocity
  c.hybrid.velocity_beta = args.velocity_beta
  task = gpt2_small.build_task(c)
  # The driver `train` uses: the same initial params, schedule and velocity bookkeeping.
  driver = train_lib.make_driver(c, init_params=task.init_params, loss_fn=task.loss_fn)
  ctx, schedule = driver.ctx, driver.schedule
  state = driver.init_state()
  full_step = jax.jit(step_lib.make_phase_step(ctx, Branch.FULL_STEP), donate_argnums=0)
  step_fn = lambda s, b: full_step(s, b, schedule)  # noqa: E731
  eval_fn = train_lib.make_eval_fn(task.loss_fn)
  move = jax.jit(
    lambda p, v, a: features_lib.add_scaled_by_group(ctx.groups, p, a * np.ones(ctx.groups.n_groups, np.float32), v)
  )
  evaluate = lambda p: train_lib.evaluate(eval_fn, p, task.eval_batches)  # noqa: E731

  kmax = int(max(alphas))
  print(
    f"preset {args.preset}, velocity_beta {args.velocity_beta}; eval loss at theta + a*v "
    f"(a = {alphas}) vs after k further real steps (k = a)"
  )
  step = 0
  for target in at:
    while step < target:
      state, _ = step_fn(state, task.train_batch(step))
      step += 1
    p0 = jax.device_get(state.train.params)
    v = jax.device_get(state.velocity)
    along = [evaluate(move(p0, v, a)) for a in alphas]
    # The same number of real steps from here, on a copy (the run itself continues from `state`).
    ref = jax.tree.map(np.copy, jax.device_get(state))
    real = {0: evaluate(p0)}
    s = jax.device_put(ref)
    for k in range(1, kmax + 1):
      s, _ = step_fn(s, task.train_batch(step + k - 1))
      if float(k) in alphas:
        real[k] = evaluate(s.train.params)
    vnorm = float(np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(v))))
    print(f"step {target}: |v| = {vnorm:.4f}")
    print("  a / k      " + "".join(f"{a:>9g}" for a in alphas))
    print("  along v    " + "".join(f"{x:>9.4f}" for x in along))
    print("  real steps " + "".join(f"{real.get(int(a), float('nan')):>9.4f}" for a in alphas))


if __name__ == "__main__":
  main()
