"""The residual corrector (hybridjax.methods.velocity.corrector) on its own, and `hybrid.corrector.enabled`."""

from __future__ import annotations

import functools

import chex
import hybrid_helper as hh
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridjax.hybrid.phases import Phase
from hybridjax.methods.velocity import corrector as corr

F, CAP, HIDDEN, LR = 5, 4, 16, 1e-2


def _fresh(seed=0):
  return corr.init_corrector(jax.random.PRNGKey(seed), F, CAP, HIDDEN, LR)


def test_untrained_corrector_changes_nothing():
  state = _fresh()
  x = jax.random.normal(jax.random.PRNGKey(1), (F,)) * 3.0
  pos = jnp.linspace(0.25, 1.0, 4)
  delta, log_scale = corr.apply_corrector(state, x, pos, HIDDEN)
  chex.assert_shape((delta, log_scale), ((4,), (4,)))
  chex.assert_trees_all_equal(delta, jnp.zeros(4))
  chex.assert_trees_all_equal(log_scale, jnp.zeros(4))
  assert int(state.write) == 0 and int(state.updates) == 0 and not bool(state.valid.any())


def _add(state, i, enabled=True, log_scale=0.1):
  x = jnp.full((F,), float(i))
  return corr.add_residual(
    state, x, jnp.float32(0.25 * (i + 1)), jnp.float32(0.01 * i), jnp.float32(log_scale), jnp.bool_(enabled)
  )


def test_add_residual_disabled_leaves_the_state_bit_identical():
  state = _add(_fresh(), 0)
  chex.assert_trees_all_equal(_add(state, 1, enabled=False), state)
  chex.assert_trees_all_equal(jax.jit(_add, static_argnums=(1, 2))(state, 7, False), state)


def test_add_residual_writes_the_ring_slot_and_wraps():
  state = _fresh()
  for i in range(CAP):
    state = _add(state, i)
    assert int(state.write) == (i + 1) % CAP
    np.testing.assert_array_equal(state.valid, np.arange(CAP) <= i)
    np.testing.assert_array_equal(state.x[i], np.full((F,), float(i)))
    assert float(state.pos[i]) == 0.25 * (i + 1) and float(state.target_delta[i]) == np.float32(0.01 * i)
  state = _add(state, CAP, log_scale=9.0)  # wraps onto slot 0; the target is clipped to the bound
  assert int(state.write) == 1 and bool(state.valid.all())
  np.testing.assert_array_equal(state.x[0], np.full((F,), float(CAP)))
  np.testing.assert_array_equal(state.x[1], np.full((F,), 1.0))  # the next slot is untouched
  assert float(state.target_log_scale[0]) == corr.LOG_SCALE_MAX
  state = _add(state, CAP + 1, log_scale=-9.0)
  assert float(state.target_log_scale[1]) == corr.LOG_SCALE_MIN


def _filled(seed=0):
  """A corrector whose buffer holds CAP residuals with a pattern to learn."""
  state = _fresh(seed)
  rng = np.random.default_rng(seed)
  for i in range(CAP):
    x = rng.normal(size=(F,)).astype(np.float32)
    state = corr.add_residual(
      state,
      jnp.asarray(x),
      jnp.float32((i + 1) / CAP),
      jnp.float32(0.02 * x[0]),
      jnp.float32(-0.5 * np.tanh(x[1])),
      jnp.bool_(True),
    )
  return state


@functools.partial(jax.jit, static_argnums=1)
def _train(state, n):
  def body(s, _):
    s, loss = corr.train_corrector(s, HIDDEN, LR, jnp.bool_(True))
    return s, loss

  return jax.lax.scan(body, state, None, length=n)


def test_train_corrector_lowers_its_loss_on_a_fixed_buffer():
  state = _filled()
  before = float(corr.corrector_loss(state.params, state, HIDDEN))
  assert before > 0
  trained, losses = _train(state, 300)
  after = float(corr.corrector_loss(trained.params, trained, HIDDEN))
  assert int(trained.updates) == 300
  assert after < 0.1 * before, (before, after)
  assert float(losses[0]) == before and np.all(np.isfinite(losses))
  # The buffer itself is only read.
  for name in ("x", "pos", "target_delta", "target_log_scale", "valid", "write"):
    chex.assert_trees_all_equal(getattr(trained, name), getattr(state, name))
  # Disabled, one step changes nothing but reports the loss.
  same, loss = jax.jit(lambda s: corr.train_corrector(s, HIDDEN, LR, jnp.bool_(False)))(state)
  chex.assert_trees_all_equal(same, state)
  assert float(loss) == before


@settings(max_examples=20, deadline=None)
@given(scale=st.floats(1.0, 1e4), seed=st.integers(0, 2**16))
def test_log_scale_stays_within_its_bounds(scale, seed):
  state = _fresh()
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), 64))
  params = jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape) * scale, state.params)
  x = jax.random.normal(next(keys), (F,)) * scale
  _, log_scale = _apply(state.replace(params=params), x, jnp.linspace(0.0, 1.0, 9))
  assert np.all(log_scale >= corr.LOG_SCALE_MIN) and np.all(log_scale <= corr.LOG_SCALE_MAX), log_scale


_apply = jax.jit(lambda s, x, pos: corr.apply_corrector(s, x, pos, HIDDEN))


def test_log_scale_saturates_at_the_bounds():
  state = _fresh()
  out = state.params["Dense_2"]
  for sign, bound in ((1.0, corr.LOG_SCALE_MAX), (-1.0, corr.LOG_SCALE_MIN)):
    bias = out["bias"].at[1].set(sign * 100.0)
    s = state.replace(params={**state.params, "Dense_2": {**out, "bias": bias}})
    _, log_scale = _apply(s, jnp.ones((F,)), jnp.linspace(0.0, 1.0, 3))
    np.testing.assert_array_equal(log_scale, np.full(3, bound, np.float32))


# --- inside hybrid training -----------------------------------------------------------------------


@pytest.mark.slow
def test_disabled_corrector_is_never_touched_by_hybrid_steps():
  # corrector.enabled=False: through WARMUP, FULL, PREDICT (validated predicted steps) and CORRECT
  # entries, the corrector state stays bit-identical to its initial value; enabled (the control
  # run), it collects residuals and trains.
  off = hh.setup(**hh.GATED)
  assert not off.ctx.settings.corrector_enabled
  state0 = off.init_state()
  initial = jax.device_get(state0.method.corrector)
  state, trace = off.run(150, state=state0)
  phases = [int(m["phase"]) for m in trace]
  assert set(phases) == {0, 1, 2, 3}, phases
  c = jax.device_get(state.controller)
  assert int(c.forward_passes) > 1 and int(c.predict_phases) > 1  # validations ran, phases ended
  entries = sum(a == Phase.PREDICT and b == Phase.CORRECT for a, b in zip(phases, phases[1:]))
  assert entries > 1  # CORRECT entries ran (each would train an enabled corrector)
  chex.assert_trees_all_equal(jax.device_get(state.method.corrector), initial)
  on_state, _ = hh.setup().run(80)
  on = jax.device_get(on_state.method.corrector)
  assert int(on.updates) > 0 and bool(on.valid.any())
  assert any(np.any(a != b) for a, b in zip(jax.tree.leaves(on.params), jax.tree.leaves(initial.params)))
  assert int(on_state.controller.phase_steps[Phase.PREDICT]) > 0
