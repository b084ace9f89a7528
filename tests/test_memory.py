"""Memory behaviour of the hybrid step: donation, flat live memory, bounded overhead, no transfers.

Everything runs on the small MLP regression problem; one context and one set of compiled,
donating step functions is shared by every test in this module (see `_setup`).

On CPU, `device.memory_stats()` is None, so "memory" here means the arrays JAX keeps alive
(`jax.live_arrays()`), which is exact, plus the process RSS, which is noisy.
"""

from __future__ import annotations

import gc
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from conftest import STD, small_hybrid_config
from hybridjax import config as config_lib
from hybridjax import memory as memory_lib
from hybridjax import state as state_lib
from hybridjax import steps as steps_lib
from hybridjax import trainer
from hybridjax.models import mlp

TOTAL_STEPS = 1200
DONATION_WARNING = "donated buffers were not usable"
PHASES = (state_lib.WARMUP, state_lib.FULL, state_lib.PREDICT, state_lib.CORRECT)

_CACHE: dict = {}


def _setup() -> dict:
  """Builds (once per module) the problem, the context and the jitted donating step functions."""
  if not _CACHE:
    model = mlp.MLP(features=(16, 16), n_out=1)
    x, y = mlp.make_regression_problem(0, n_in=4)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))["params"]
    loss_fn = mlp.make_loss_fn(model)
    oc = config_lib.default_optim_config()
    oc.learning_rate, oc.warmup_steps = 1e-2, 5
    tx = trainer.make_optimizer(oc, TOTAL_STEPS)
    ctx = steps_lib.make_context(small_hybrid_config(**STD), loss_fn=loss_fn, tx=tx,
                                 params_shape=params,
                                 total_steps=TOTAL_STEPS)
    phase_fns = [jax.jit(steps_lib.make_phase_step(ctx, b), donate_argnums=0, keep_unused=True)
                 for b in range(state_lib.N_BRANCHES)]
    fused = jax.jit(lambda s, b: steps_lib.hybrid_step(ctx, s, b), donate_argnums=0,
                    keep_unused=True)
    _CACHE.update(
        params=jax.device_get(params),  # host copy: states get fresh device buffers to donate
        loss_fn=loss_fn, tx=tx, ctx=ctx, phase_fns=phase_fns, fused=fused,
        base_step=trainer.make_train_step(loss_fn, tx),
        batch=lambda i: mlp.regression_batch(x, y, step=i, batch_size=32, seed=0))
  return _CACHE


def _fresh_params(s):
  return jax.tree.map(jnp.asarray, s["params"])


def _hybrid_state(s, seed=0):
  return steps_lib.init_hybrid_state(s["ctx"], _fresh_params(s), jax.random.PRNGKey(seed))


def _base_state(s):
  return trainer.init_train_state(_fresh_params(s), s["tx"])


def _tree_bytes(tree) -> int:
  return int(sum(leaf.nbytes for leaf in jax.tree.leaves(tree)))


def _live_bytes() -> tuple[int, int]:
  gc.collect()
  return memory_lib.live_array_stats()


def _hybrid_step(s, state, i):
  """One host-dispatched hybrid step; returns the new state and the metrics as host values."""
  branch = int(jax.device_get(state.controller.next_branch))
  state, metrics = s["phase_fns"][branch](state, s["batch"](i))
  return state, branch, jax.device_get(metrics)


def _assert_donated(old_leaves, what):
  kept = [i for i, leaf in enumerate(old_leaves) if not leaf.is_deleted()]
  assert not kept, f"{what}: {len(kept)} donated input leaves were not consumed: {kept}"


def _no_donation_warnings(caught):
  bad = [str(w.message) for w in caught if DONATION_WARNING in str(w.message)]
  assert not bad, bad


# --- 1. donation ---------------------------------------------------------------------------------


def test_every_phase_step_consumes_its_donated_state():
  s = _setup()
  state = _hybrid_state(s)
  seen_branches, seen_phases = set(), set()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(200):
      old = jax.tree.leaves(state)
      state, branch, metrics = _hybrid_step(s, state, i)
      jax.block_until_ready(state)
      _assert_donated(old, f"branch {branch} at step {i}")
      del old
      seen_branches.add(branch)
      seen_phases.add(int(metrics["phase"]))
      if len(seen_branches) == state_lib.N_BRANCHES and len(seen_phases) == len(PHASES):
        break
  _no_donation_warnings(caught)
  assert seen_branches == set(range(state_lib.N_BRANCHES)), seen_branches
  assert seen_phases == set(PHASES), seen_phases


def test_fused_and_baseline_steps_consume_their_donated_state():
  s = _setup()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for name, step_fn, state in (("fused hybrid_step", s["fused"], _hybrid_state(s)),
                                 ("baseline train_step", s["base_step"], _base_state(s))):
      for i in range(3):
        old = jax.tree.leaves(state)
        state, _ = step_fn(state, s["batch"](i))
        jax.block_until_ready(state)
        _assert_donated(old, f"{name} at step {i}")
      del state
  _no_donation_warnings(caught)


# --- 2. flat memory ------------------------------------------------------------------------------


def test_live_memory_is_flat_over_1000_hybrid_steps():
  s = _setup()
  state = _hybrid_state(s, seed=1)
  phases = np.zeros(4, np.int64)
  readings = {}
  for i in range(1, 1001):
    state, _, metrics = _hybrid_step(s, state, i)
    phases[int(metrics["phase"])] += 1
    del metrics
    if i in (20, 200, 1000):
      jax.block_until_ready(state)
      readings[i] = (*_live_bytes(), memory_lib.process_rss_bytes())
  assert all(phases[p] > 0 for p in PHASES), f"phase step counts {phases.tolist()}"
  # Live arrays: exactly the same number and bytes (the state, plus whatever the module holds).
  assert readings[20][:2] == readings[1000][:2], readings
  # RSS is noisy (allocator caches, page reuse); steps 1-200 also include the first executions
  # of every branch. After that, growth over 800 more steps must stay under 2%.
  rss_200, rss_1000 = readings[200][2], readings[1000][2]
  growth = (rss_1000 - rss_200) / rss_200
  print(f"live arrays @20 {readings[20][:2]}, @1000 {readings[1000][:2]}; RSS @200 {rss_200} B, "
        f"@1000 {rss_1000} B, growth {growth:.3%}; phase steps {phases.tolist()}")
  assert growth < 0.02, (f"RSS grew {growth:.2%} from step 200 ({rss_200} B) to 1000 "
                         f"({rss_1000} B); phase steps {phases.tolist()}")


# --- 3. bounded overhead -------------------------------------------------------------------------


def test_hybrid_state_overhead_is_exactly_its_extra_buffers():
  s = _setup()
  state = _hybrid_state(s)
  base = _base_state(s)
  params_bytes = _tree_bytes(state.train.params)
  extra = {name: _tree_bytes(getattr(state, name))
           for name in ("velocity", "dynamics", "corrector", "history", "controller", "rng")}
  assert _tree_bytes(state) - _tree_bytes(base) == sum(extra.values()), extra
  assert _tree_bytes(state.train) == _tree_bytes(base)
  # Trajectory memory is one params-sized buffer (the velocity); no params snapshot is kept.
  assert extra["velocity"] == params_bytes
  assert extra["velocity"] <= 2 * params_bytes


def test_peak_live_bytes_bounded_by_baseline_plus_extra_buffers():
  """Peak = max over steps of the live-array bytes sampled right after each step.

  This is a post-step sample, not an allocator peak: CPU does not report
  `peak_bytes_in_use`, and XLA temporaries inside a step are not jax arrays.
  """
  s = _setup()
  n_steps = 40
  ref = _live_bytes()[1]
  base = _base_state(s)
  base_peak = 0
  for i in range(n_steps):
    base, m = s["base_step"](base, s["batch"](i))
    jax.block_until_ready(base)
    del m
    base_peak = max(base_peak, memory_lib.live_array_stats()[1] - ref)
  del base
  ref = _live_bytes()[1]
  state = _hybrid_state(s)
  extra = sum(_tree_bytes(getattr(state, n))
              for n in ("velocity", "dynamics", "corrector", "history", "controller", "rng"))
  hyb_peak, phases = 0, set()
  for i in range(n_steps):
    state, _, metrics = _hybrid_step(s, state, i)
    phases.add(int(metrics["phase"]))
    jax.block_until_ready(state)
    hyb_peak = max(hyb_peak, memory_lib.live_array_stats()[1] - ref)
  assert phases == set(PHASES), phases
  print(f"post-step live-bytes peak: baseline {base_peak} B, hybrid {hyb_peak} B, "
        f"extra buffers {extra} B")
  assert hyb_peak <= base_peak + extra, (hyb_peak, base_peak, extra)


# --- 4. no implicit transfers --------------------------------------------------------------------


def test_fused_step_makes_no_implicit_host_transfers():
  s = _setup()
  state = _hybrid_state(s)
  batches = [jax.device_put(s["batch"](i)) for i in range(6)]
  state, _ = s["fused"](state, jax.device_put(s["batch"](100)))  # compile outside the guard
  jax.block_until_ready(state)
  collected = []
  with jax.transfer_guard("disallow"):
    for b in batches:
      state, metrics = s["fused"](state, b)
      collected.append(metrics)
    jax.block_until_ready(state)
  phases = [int(p) for p in jax.device_get([m["phase"] for m in collected])]
  assert len(phases) == len(batches)


def test_memory_limit_warns_once_and_saves_an_emergency_checkpoint(tmp_path, capsys):
  """Crossing trainer.memory_limit_bytes warns and checkpoints once, then training goes on."""
  from conftest import micro_config
  from experiments import gpt2_small
  c = micro_config(mode="baseline", steps=12)  # the check lives in the trainer loop, for both modes
  c.trainer.log_every = 4
  c.trainer.memory_limit_bytes = 1  # any run exceeds one byte: the first log crosses it
  gpt2_small.run(c, str(tmp_path / "run"))
  out = capsys.readouterr().out
  assert out.count("exceeds trainer.memory_limit_bytes=1") == 1, out
  steps = sorted(int(d) for d in os.listdir(tmp_path / "run" / "checkpoints") if d.isdigit())
  assert steps == [4, 12], steps  # the emergency save at the first log, and the final one
