"""The fused hybrid step copies nothing beyond what each transition's own program copies.

Memory readings between steps cannot see a copy made inside a step, so this reads the compiled
programs (`memory.count_copies`). With `lax.switch`, XLA gives the conditional's results buffers of
their own: the whole state was copied back after it on every step, and a predicted step copied every
leaf it passed through. The fused step (`hybrid.step.hybrid_step`) updates the donated state in place.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from conftest import STD, small_hybrid_config

from hybridjax import config as config_lib
from hybridjax import memory, optim
from hybridjax.hybrid import step as step_lib
from hybridjax.loop import drivers
from hybridjax.models import mlp

# Copies outside the transitions: a few scalars (the branch index, counters), never the state.
ENTRY_COPY_LIMIT_BYTES = 1024


@functools.cache
def _setup():
  net = mlp.MLP(features=(16, 16), n_out=1)
  x, y = mlp.make_regression_problem(0, n_in=4)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))["params"]
  oc = config_lib.default_optim_config()
  ctx = drivers.make_context(
    small_hybrid_config(**STD),
    loss_fn=mlp.make_loss_fn(net),
    tx=optim.make_optimizer(oc),
    params_shape=params,
    total_steps=100,
  )
  state = jax.eval_shape(lambda: step_lib.init_hybrid_state(ctx, params, jax.random.PRNGKey(0)))
  batch = mlp.regression_batch(x, y, step=0, batch_size=32, seed=0)
  return ctx, state, batch, optim.make_schedule(oc, 100)


def _compile(fn, batch=None):
  ctx, state, one_batch, schedule = _setup()
  return (
    jax.jit(lambda s, b, k: fn(ctx, s, b, k), donate_argnums=0, keep_unused=True)
    .lower(state, one_batch if batch is None else batch, schedule)
    .compile()
  )


def _state_bytes() -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(_setup()[1]))


def _lax_switch_step(ctx, state, batch, schedule):
  phase = state.controller.phase
  branches = [functools.partial(lambda f, s, b, k: f(ctx, s, b, k), f) for f in step_lib.transitions(ctx)]
  new_state, info = jax.lax.switch(state.controller.next_branch, branches, state, batch, schedule)
  return step_lib.finish_step(ctx, new_state, info, phase, state.controller.next_branch)


@pytest.mark.slow  # CI runs it (`-m ""`); kept out of the default suite's 300 s
def test_the_fused_step_copies_no_state_outside_the_transitions():
  n, nbytes = memory.count_copies(_compile(step_lib.hybrid_step), entry_only=True)
  assert nbytes <= ENTRY_COPY_LIMIT_BYTES, f"{n} copies, {nbytes} B, outside the transitions"


@pytest.mark.slow  # CI runs it (`-m ""`); kept out of the default suite's 300 s
def test_the_multi_step_scan_copies_no_state_per_iteration():
  ctx, state, batch, schedule = _setup()
  batches = jax.tree.map(lambda x: jnp.stack([x] * 4), batch)
  text = _compile(step_lib.hybrid_multi_step, batches).as_text()
  # Only the entry and the scan's own body lie outside the transitions' loops; the body's copies are
  # the ones a `lax.switch` made there (the whole state) if any.
  copies = memory.list_copies(text)
  assert sum(c["bytes"] for c in copies if c["entry"]) <= ENTRY_COPY_LIMIT_BYTES
  assert sum(c["bytes"] for c in copies) < 3 * _state_bytes()  # the transitions' own, not K state copies


@pytest.mark.slow
def test_the_check_catches_a_lax_switch_and_the_fused_step_copies_only_what_the_transitions_do():
  _, switch_bytes = memory.count_copies(_compile(_lax_switch_step), entry_only=True)
  assert switch_bytes >= 0.9 * _state_bytes()  # the copy-back of the whole state: the test can fail
  fused = memory.count_copies(_compile(step_lib.hybrid_step))
  own = [
    memory.count_copies(_compile(lambda c, s, b, k, i=i: step_lib.make_phase_step(c, i)(s, b, k)))
    for i in range(len(step_lib.transitions(_setup()[0])))
  ]
  assert fused[1] <= sum(b for _, b in own) + ENTRY_COPY_LIMIT_BYTES, (fused, own)
