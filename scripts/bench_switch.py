"""Per-phase step time: three separately jitted phase functions vs the fused `lax.switch` step.

  .venv/bin/python scripts/bench_switch.py [--model tiny|micro|mlp] [--repeats 30]

For each phase (WARMUP and FULL real steps, a PREDICT step, the CORRECT entry step) it captures one
hybrid state in that phase (by running the hybrid with host dispatch), then times, on identical
copies of that state and the same device-resident batch, (a) the phase's own jitted donating
function and (b) the fused `hybrid_step` jitted with donation. Both are compiled before timing;
each timed call gets a fresh copy (`jnp.copy`, made outside the timed region) since it is donated.
The last line is `switch_overhead max=<worst fused/separate ratio>`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hybridjax import config as config_lib  # noqa: E402
from hybridjax import state as state_lib  # noqa: E402
from hybridjax import steps as steps_lib  # noqa: E402
from hybridjax import trainer  # noqa: E402

# Predict early and often (as in tests/test_hybrid.py), so every phase is reached in a few steps.
HYBRID_OVERRIDES = dict(confidence_threshold=0.0, max_predict_steps=4, divergence_tolerance=0.5,
                        correction_interval=2, warmup_steps=10, full_steps=5, history_size=16,
                        window=8)
# (label, phase, branch) of the step kinds timed.
KINDS = (("WARMUP real", state_lib.WARMUP, state_lib.BRANCH_REAL),
         ("FULL real", state_lib.FULL, state_lib.BRANCH_REAL),
         ("PREDICT", state_lib.PREDICT, state_lib.BRANCH_PREDICT),
         ("CORRECT entry", state_lib.CORRECT, state_lib.BRANCH_CORRECT_ENTRY))


def _small_hybrid(h):
  for k, v in HYBRID_OVERRIDES.items():
    h[k] = v
  h.rssm.deter, h.rssm.latent, h.rssm.hidden, h.rssm.ensemble = 32, 8, 32, 2
  return h


def build(model: str, steps: int = 1000):
  """(hybrid config, loss_fn, tx, params, batch(i) -> host batch, description)."""
  if model == "mlp":
    from hybridjax.models import mlp
    net = mlp.MLP(features=(16, 16), n_out=1)
    x, y = mlp.make_regression_problem(0, n_in=4)
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))["params"]
    oc = config_lib.default_optim_config()
    oc.learning_rate, oc.warmup_steps = 1e-2, 5
    return (_small_hybrid(config_lib.default_hybrid_config()), mlp.make_loss_fn(net),
            trainer.make_optimizer(oc, steps), params,
            lambda i: mlp.regression_batch(x, y, step=i, batch_size=32, seed=0),
            "MLP 4-16-16-1, batch 32")
  from experiments import gpt2_small
  from experiments.configs import gpt2_small as gpt2_cfg
  c = gpt2_cfg.get_config("tiny")
  c.trainer.steps = steps
  if model == "micro":  # tests/conftest.py::micro_config
    c.model.n_layer, c.model.d_model, c.model.n_head, c.model.n_ctx = 1, 32, 2, 32
    c.trainer.batch_size = 4
  task = gpt2_small.build_task(c)
  params = task["init_params"](jax.random.PRNGKey(c.seed))
  n = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  desc = (f"GPT-2 {model}: {c.model.n_layer} layers, d_model {c.model.d_model}, n_ctx "
          f"{c.model.n_ctx}, batch {c.trainer.batch_size}, {n:,} params")
  return (_small_hybrid(c.hybrid), task["loss_fn"], trainer.make_optimizer(c.optim, steps),
          params, task["train_batch"], desc)


def capture_states(ctx, phase_fns, params, batch, max_steps=200):
  """Runs the hybrid (host dispatch) and keeps a host copy of the first state of each kind."""
  state = steps_lib.init_hybrid_state(ctx, params, jax.random.PRNGKey(0))
  found = {}
  for i in range(max_steps):
    phase, branch = (int(v) for v in jax.device_get(
        (state.controller.phase, state.controller.next_branch)))
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


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", choices=("tiny", "micro", "mlp"), default="tiny",
                  help="tiny: the gpt2 `tiny` preset; micro: tests/conftest.py micro_config; mlp")
  ap.add_argument("--repeats", type=int, default=30)
  ap.add_argument("--warmup-calls", type=int, default=3, help="untimed calls before timing")
  args = ap.parse_args(argv)

  t_start = time.perf_counter()
  hybrid, loss_fn, tx, params, batch_fn, desc = build(args.model)
  ctx = steps_lib.make_context(hybrid, loss_fn=loss_fn, tx=tx, params_shape=params,
                               total_steps=1000)
  state0 = steps_lib.init_hybrid_state(ctx, jax.tree.map(jnp.copy, params), jax.random.PRNGKey(0))
  batch = jax.device_put(batch_fn(10_000))
  t0 = time.perf_counter()
  sep = [jax.jit(steps_lib.make_phase_step(ctx, b), donate_argnums=0, keep_unused=True)
         .lower(state0, batch).compile() for b in range(state_lib.N_BRANCHES)]
  t_sep = time.perf_counter() - t0
  t0 = time.perf_counter()
  fused = jax.jit(lambda s, b: steps_lib.hybrid_step(ctx, s, b), donate_argnums=0,
                  keep_unused=True).lower(state0, batch).compile()
  t_fused = time.perf_counter() - t0
  del state0
  states = capture_states(ctx, sep, params, lambda i: jax.device_put(batch_fn(i)))

  rows = []
  for label, phase, branch in KINDS:
    host = states[label]
    for _ in range(args.warmup_calls):
      time_call(sep[branch], host, batch, 1)
      time_call(fused, host, batch, 1)
    # Interleave the two so drift in machine load hits both alike.
    ts, tf = [], []
    for _ in range(args.repeats):
      ts += time_call(sep[branch], host, batch, 1)
      tf += time_call(fused, host, batch, 1)
    ms_s, ms_f = 1e3 * np.median(ts), 1e3 * np.median(tf)
    rows.append((label, ms_s, ms_f, ms_f / ms_s))

  print(f"model: {desc}; device {jax.devices()[0].platform}; repeats {args.repeats} "
        f"(median); compile: separate {t_sep:.1f}s (3 fns), fused {t_fused:.1f}s")
  print(f"{'phase':<15}{'separate ms':>13}{'fused ms':>11}{'fused/sep':>11}")
  for label, ms_s, ms_f, r in rows:
    print(f"{label:<15}{ms_s:>13.3f}{ms_f:>11.3f}{r:>11.3f}")
  print(f"total wall time {time.perf_counter() - t_start:.1f}s")
  print(f"switch_overhead max={max(r[3] for r in rows):.3f}")


if __name__ == "__main__":
  main()
