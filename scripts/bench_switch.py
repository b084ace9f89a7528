"""Per-phase step time: each transition's own jitted function vs the fused step.

  .venv/bin/python scripts/bench_switch.py [--model tiny|micro|mlp] [--repeats 30]

For each phase (WARMUP and FULL full steps, a PREDICT step, the CORRECT entry step) it captures one
hybrid state in that phase (by running the hybrid with host dispatch), then times, on identical
copies of that state and the same device-resident batch, (a) the transition's own jitted donating
function and (b) the fused `hybrid_step` jitted with donation. Both are compiled before timing; each
timed call gets a fresh copy (`jnp.copy`, made outside the timed region) since it is donated.

It prints the table, the copy instructions in each compiled program (`memory.count_copies`), and as
its last line `switch_overhead max=<f>`: the largest extra time of the fused step over the
transition's own function, per step, as a fraction of a FULL step's time.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hybridjax import config as config_lib  # noqa: E402
from hybridjax import (
  memory,  # noqa: E402
  optim,  # noqa: E402
)
from hybridjax.hybrid import step as step_lib  # noqa: E402
from hybridjax.hybrid.phases import BRANCH_NAMES, Branch, Phase  # noqa: E402
from hybridjax.loop import drivers  # noqa: E402

# Predict early and often, so every phase is reached in a few steps.
HYBRID_OVERRIDES = {
  "confidence_threshold": 0.0,
  "max_predict_steps": 4,
  "velocity.divergence_tolerance": 0.5,
  "correction_interval": 2,
  "warmup_steps": 10,
  "full_steps": 5,
}
# (label, phase, branch) of the step kinds timed.
KINDS = (
  ("WARMUP full", Phase.WARMUP, Branch.FULL_STEP),
  ("FULL full", Phase.FULL, Branch.FULL_STEP),
  ("PREDICT", Phase.PREDICT, Branch.PREDICT_STEP),
  ("CORRECT entry", Phase.CORRECT, Branch.CORRECT_STEP),
)


def _small_hybrid(h):
  h.update_from_flattened_dict(HYBRID_OVERRIDES)
  h.velocity.update(history_size=16, window=8)
  h.velocity.rssm.update(deter=32, latent=8, hidden=32, ensemble=2)
  return h


def build(model: str, steps: int = 1000):
  """(hybrid config, loss_fn, optim config, params, batch(i) -> host batch, description)."""
  if model == "mlp":
    from hybridjax.models import mlp

    net = mlp.MLP(features=(16, 16), n_out=1)
    x, y = mlp.make_regression_problem(0, n_in=4)
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))["params"]
    oc = config_lib.default_optim_config()
    oc.learning_rate, oc.warmup_steps = 1e-2, 5
    return (
      _small_hybrid(config_lib.default_hybrid_config()),
      mlp.make_loss_fn(net),
      oc,
      params,
      lambda i: mlp.regression_batch(x, y, step=i, batch_size=32, seed=0),
      "MLP 4-16-16-1, batch 32",
    )
  from experiments import gpt2_small
  from experiments.configs import gpt2_small as gpt2_cfg

  c = gpt2_cfg.get_config("tiny,micro" if model == "micro" else "tiny")
  c.trainer.steps = steps
  task = gpt2_small.build_task(c)
  params = task.init_params(jax.random.PRNGKey(c.seed))
  n = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  desc = (
    f"GPT-2 {model}: {c.model.n_layer} layers, d_model {c.model.d_model}, n_ctx "
    f"{c.model.n_ctx}, batch {c.trainer.batch_size}, {n:,} params"
  )
  return _small_hybrid(c.hybrid), task.loss_fn, c.optim, params, task.train_batch, desc


def capture_states(ctx, phase_fns, params, batch, max_steps=200):
  """Runs the hybrid (host dispatch) and keeps a host copy of the first state of each kind."""
  state = step_lib.init_hybrid_state(ctx, params, jax.random.PRNGKey(0))
  found = {}
  for i in range(max_steps):
    phase, branch = (int(v) for v in jax.device_get((state.controller.phase, state.controller.next_branch)))
    for label, p, b in KINDS:
      if (p, b) == (phase, branch) and label not in found:
        found[label] = jax.device_get(state)
    if len(found) == len(KINDS):
      return found
    state, _ = phase_fns[branch](state, batch(i))
  missing = [k[0] for k in KINDS if k[0] not in found]
  raise RuntimeError(f"phases not reached in {max_steps} steps: {missing}")


def time_call(fn, host_state, batch, repeats):
  times = []
  dev = jax.device_put(host_state)
  for _ in range(repeats):
    s = jax.tree.map(jnp.copy, dev)
    jax.block_until_ready(s)
    t0 = time.perf_counter()
    out = fn(s, batch)
    jax.block_until_ready(out)
    times.append(time.perf_counter() - t0)
    del out, s
  return times


def lax_switch_step(ctx, state, batch, schedule):
  """The fused step as a plain `lax.switch` over the transitions (for comparison only)."""
  phase = state.controller.phase
  branches = [functools.partial(lambda f, s, b, sch: f(ctx, s, b, sch), f) for f in step_lib.transitions(ctx)]
  new_state, info = jax.lax.switch(state.controller.next_branch, branches, state, batch, schedule)
  return step_lib.finish_step(ctx, new_state, info, phase, state.controller.next_branch)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument(
    "--model",
    choices=("tiny", "micro", "mlp"),
    default="tiny",
    help="tiny: the gpt2 `tiny` preset; micro: its `tiny,micro` variant; mlp: a small MLP",
  )
  ap.add_argument("--repeats", type=int, default=30)
  ap.add_argument("--warmup-calls", type=int, default=3, help="untimed calls before timing")
  ap.add_argument(
    "--fused",
    choices=("in_place", "lax_switch"),
    default="in_place",
    help="in_place: hybrid_step (the default fused step); lax_switch: a plain lax.switch",
  )
  args = ap.parse_args(argv)

  t_start = time.perf_counter()
  hybrid, loss_fn, optim_cfg, params, batch_fn, desc = build(args.model)
  ctx = drivers.make_context(
    hybrid, loss_fn=loss_fn, tx=optim.make_optimizer(optim_cfg), params_shape=params, total_steps=1000
  )
  schedule = optim.make_schedule(optim_cfg, 1000)
  state0 = step_lib.init_hybrid_state(ctx, jax.tree.map(jnp.copy, params), jax.random.PRNGKey(0))
  batch = jax.device_put(batch_fn(10_000))
  t0 = time.perf_counter()
  sep_compiled = [
    jax.jit(step_lib.make_phase_step(ctx, b), donate_argnums=0, keep_unused=True)
    .lower(state0, batch, schedule)
    .compile()
    for b in range(len(BRANCH_NAMES))
  ]
  t_sep = time.perf_counter() - t0
  fused_fn = step_lib.hybrid_step if args.fused == "in_place" else lax_switch_step
  t0 = time.perf_counter()
  fused_compiled = (
    jax.jit(lambda s, b, sch: fused_fn(ctx, s, b, sch), donate_argnums=0, keep_unused=True)
    .lower(state0, batch, schedule)
    .compile()
  )
  t_fused = time.perf_counter() - t0
  del state0
  sep = [functools.partial(lambda f, s, b: f(s, b, schedule), f) for f in sep_compiled]
  fused = lambda s, b: fused_compiled(s, b, schedule)  # noqa: E731
  states = capture_states(ctx, sep, params, lambda i: jax.device_put(batch_fn(i)))

  rows = []
  for label, _, branch in KINDS:
    host = states[label]
    for _ in range(args.warmup_calls):
      time_call(sep[branch], host, batch, 1)
      time_call(fused, host, batch, 1)
    # Interleave the two so drift in machine load hits both alike.
    ts, tf = [], []
    for _ in range(args.repeats):
      ts += time_call(sep[branch], host, batch, 1)
      tf += time_call(fused, host, batch, 1)
    rows.append((label, 1e3 * np.median(ts), 1e3 * np.median(tf)))
  full_ms = dict((r[0], r[1]) for r in rows)["FULL full"]

  print(
    f"model: {desc}; device {jax.devices()[0].platform}; repeats {args.repeats} (median); fused step: "
    f"{args.fused}; compile: separate {t_sep:.1f}s (3 fns), fused {t_fused:.1f}s"
  )
  print(f"{'phase':<15}{'separate ms':>13}{'fused ms':>11}{'fused/sep':>11}{'extra/FULL':>12}")
  for label, ms_s, ms_f in rows:
    print(f"{label:<15}{ms_s:>13.3f}{ms_f:>11.3f}{ms_f / ms_s:>11.3f}{(ms_f - ms_s) / full_ms:>12.3f}")
  n, nbytes = memory.count_copies(fused_compiled)
  print(
    f"copies: fused {n} ({nbytes:,} B); "
    + ", ".join(
      f"{name} {memory.count_copies(c)[0]} ({memory.count_copies(c)[1]:,} B)"
      for name, c in zip(BRANCH_NAMES, sep_compiled)
    )
  )
  print(f"total wall time {time.perf_counter() - t_start:.1f}s")
  print(f"switch_overhead max={max((ms_f - ms_s) / full_ms for _, ms_s, ms_f in rows):.3f}")


if __name__ == "__main__":
  main()
