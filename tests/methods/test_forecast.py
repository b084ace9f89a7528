"""The jump's RSSM forecaster (`hybrid.jump.forecast='rssm'`, `hybridjax.methods.jump.forecast`): the realised
ratio it learns from, the aggregation of its imagined intervals into each candidate's s_g, expected
gain and agreement, that it learns a trajectory's ratios, the gate on jumps, its buffers, its settings,
and its life in the training loop (resume)."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cached, compile_fused_mlp_step, micro_config, small_hybrid_config, straight_and_resumed

from hybridjax import config as config_lib
from hybridjax import optim, preflight
from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid import step as step_lib
from hybridjax.loop import drivers
from hybridjax.methods.jump import forecast as forecast_lib
from hybridjax.methods.jump import steps as jump_lib

EVERY = 10
HORIZONS = (10, 20, 40)


def _params():
  return {"a": {"kernel": jnp.arange(6.0).reshape(3, 2) / 10}, "b": {"bias": jnp.array([0.5, -0.25])}}


def _context(loss_fn, *, params=None, min_agreement=0.5, skip_control=False):
  h = small_hybrid_config(method="jump", grouping="leaf")
  h.jump.update(horizons=HORIZONS, margin=0.0, forecast="rssm", skip_control=skip_control)
  h.jump.forecaster.update(every=EVERY, history=16, train_steps=8, min_agreement=min_agreement, learning_rate=1e-2)
  return drivers.make_context(
    h,
    loss_fn=loss_fn,
    tx=optim.make_optimizer(config_lib.default_optim_config()),
    params_shape=_params() if params is None else params,
    total_steps=1000,
    averaging_beta=0.9,
  )


def _quadratic_towards(target):
  def loss_fn(params, batch):
    del batch
    sq = jax.tree.map(lambda p, t: jnp.sum(jnp.square(p - t)), params, target)
    return sum(jax.tree.leaves(sq)), None

  return loss_fn


V = {"a": {"kernel": jnp.full((3, 2), 0.01)}, "b": {"bias": jnp.array([-0.02, 0.01])}}
RATIOS = np.array([0.6, 1.3])  # per group ('leaf' grouping: a/kernel, b/bias)


def _along(t, ratios=RATIOS):
  """The averaged iterate after t real steps of a trajectory that moves group g at ratios[g] x V."""
  return {
    "a": {"kernel": _params()["a"]["kernel"] + t * ratios[0] * V["a"]["kernel"]},
    "b": {"bias": _params()["b"]["bias"] + t * ratios[1] * V["b"]["bias"]},
  }


# Jitted once for every test (its settings and groups are static and equal across the tests).
_SNAPSHOT_JIT = jax.jit(forecast_lib.snapshot, static_argnums=(0, 1))


def _snapshot(ctx, f, i, ratios=RATIOS):
  """The i-th snapshot of that trajectory: the drift measured is V, the loss falls 0.05 per interval."""
  return _SNAPSHOT_JIT(
    ctx.settings.forecast,
    ctx.groups,
    f,
    fast=_along(i * EVERY, ratios),
    drift=V,
    lr=jnp.float32(1e-3),
    progress=jnp.float32(i / 100),
    loss_fast=jnp.float32(2.0 - 0.05 * i),
    loss_slow=jnp.float32(2.0 - 0.05 * i + 0.1),
    rng=jax.random.fold_in(jax.random.PRNGKey(0), i),
  )


class SnapshotTest(chex.TestCase):
  # The snapshot's program (its RSSM training included) takes 13-20 s to compile on 2 cores: slow set
  # (CI runs it); the default suite keeps the forecaster's learning (`test_the_rssm_learns_...`).
  @pytest.mark.slow
  def test_the_realised_ratio_is_the_averaged_iterates_move_along_the_drift_in_units_of_it(self):
    ctx = _context(_quadratic_towards(_params()))
    f = forecast_lib.init_forecast(ctx.settings.forecast, _params(), jax.random.PRNGKey(0))
    f = _snapshot(ctx, f, 1)
    assert int(f.history.count) == 1
    chex.assert_trees_all_close(f.snap_rsq, jnp.asarray([6 * 1e-4, 5e-4]), rtol=1e-5)
    f = _snapshot(ctx, f, 2)
    # Entry 0's target: the move over the interval along V, in units of EVERY x V.
    chex.assert_trees_all_close(f.history.alpha_target[0], jnp.asarray(RATIOS, jnp.float32), rtol=1e-4)
    chex.assert_trees_all_close(f.last_ratio, jnp.asarray(RATIOS, jnp.float32), rtol=1e-4)
    assert float(f.history.alpha_target[1].sum()) == 0.0  # the newest entry has no target yet
    chex.assert_shape(f.history.features, (16, forecast_lib.feature_dim(2)))

  @pytest.mark.slow  # its programs of its own (7 s at the suite's -O0): CI runs it
  def test_an_accepted_jumps_move_is_not_counted_as_the_trajectorys(self):
    ctx = _context(_quadratic_towards(_params()))
    f = forecast_lib.init_forecast(ctx.settings.forecast, _params(), jax.random.PRNGKey(0))
    # As the snapshot at step EVERY leaves it (the snapshot itself is tested above).
    f = f.replace(
      history=f.history.replace(count=jnp.asarray(1, jnp.int32)),
      snapshot_drift=V,
      snap_dot=groups_lib.group_dots(ctx.groups, _along(EVERY), V),
      snap_rsq=groups_lib.group_sq_norms(ctx.groups, V),
    )
    # A jump of 25 steps of 0.5 V (group a) and 25 steps of 2 V (group b) inside the interval.
    amount = jnp.asarray([12.5, 50.0])
    f = forecast_lib.record_jump(ctx.groups, f, amount, V, jnp.float32(0.1))
    fast = _along(2 * EVERY)
    fast = {
      "a": {"kernel": fast["a"]["kernel"] + 12.5 * V["a"]["kernel"]},
      "b": {"bias": fast["b"]["bias"] + 50.0 * V["b"]["bias"]},
    }
    ratio, valid = forecast_lib.interval_ratio(f, ctx.groups, fast, EVERY)
    assert bool(valid)
    chex.assert_trees_all_close(ratio, jnp.asarray(RATIOS, jnp.float32), rtol=1e-4)
    assert float(f.expected_gain) == pytest.approx(0.1)


class AggregateTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_constant_forecasts_give_that_scale_and_a_gain_proportional_to_k(self):
    e, h, g = 3, 4, 2
    alpha = jnp.broadcast_to(jnp.asarray([0.7, 1.5]), (e, h, g))
    dlog = jnp.full((e, h), -0.02)
    agg = self.variant(lambda a, d, k: forecast_lib.aggregate(a, d, k, EVERY, jnp.float32(1.0), 2.0))
    scales, gain, agree = agg(alpha, dlog, jnp.asarray([5, 10, 25, 40]))
    chex.assert_shape(scales, (4, g))
    chex.assert_trees_all_close(scales, jnp.broadcast_to(jnp.asarray([0.7, 1.5]), (4, g)), rtol=1e-6)
    # k / D intervals of a 0.02 drop each (a half interval counts half).
    chex.assert_trees_all_close(gain, jnp.asarray([0.01, 0.02, 0.05, 0.08]), rtol=1e-5)
    chex.assert_trees_all_close(agree, jnp.ones(4), rtol=1e-6)

  def test_scales_are_clipped_and_disagreement_lowers_the_agreement(self):
    alpha = jnp.asarray([[[3.0, -1.0]], [[3.0, -1.0]]])  # (E=2, H=1, G=2)
    dlog = jnp.asarray([[-0.01], [-0.03]])
    scales, gain, agree = forecast_lib.aggregate(alpha, dlog, jnp.asarray([10]), EVERY, jnp.float32(0.5), 2.0)
    chex.assert_trees_all_close(scales, jnp.asarray([[2.0, 0.0]]))
    chex.assert_trees_all_close(gain, jnp.asarray([0.5 * 0.02]), rtol=1e-5)  # calibration x mean
    np.testing.assert_allclose(float(agree[0]), np.exp(-0.01 / 0.02), rtol=1e-5)


@functools.cache
def learned():
  """A forecaster after 30 snapshots of the straight trajectory (jitted once)."""
  ctx = _context(_quadratic_towards(_params()))
  f = forecast_lib.init_forecast(ctx.settings.forecast, _params(), jax.random.PRNGKey(0))
  for i in range(1, 31):
    f = _snapshot(ctx, f, i)
  return ctx, f


def test_the_rssm_learns_each_groups_ratio_and_the_losss_fall():
  ctx, f = learned()
  scales, expected, agree = forecast_lib.forecast_moves(ctx.settings.forecast, f, HORIZONS, jax.random.PRNGKey(0))
  chex.assert_shape(scales, (len(HORIZONS), 2))
  # An untrained ensemble predicts ratios near 0; this one has learned each group's own.
  np.testing.assert_allclose(np.asarray(scales), np.broadcast_to(RATIOS, (3, 2)), atol=0.25)
  # The loss falls 0.05 per interval: 0.05 k / D expected, members agreeing.
  np.testing.assert_allclose(np.asarray(expected), 0.05 * np.asarray(HORIZONS) / EVERY, rtol=0.5)
  assert np.all(np.asarray(agree) > 0.5)


def _state_for(ctx, f, step=100):
  s = step_lib.init_hybrid_state(ctx, _params(), jax.random.PRNGKey(0))
  fast = jax.tree.map(lambda x: x + 0.3, _params())
  slow = jax.tree.map(lambda x, v: x + 0.3 - 50.0 * v, _params(), V)  # drift = V (both EMAs long-run)
  train = s.train.replace(step=jnp.asarray(step, jnp.int32), averaging=s.train.averaging.replace(params=fast))
  s = s.replace(
    train=train, method=s.method.replace(drift_memory=s.method.drift_memory.replace(params=slow), forecast=f)
  )
  return s


class GateTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_an_admitted_jump_moves_group_g_by_the_forecast_s_g_k_r_g(self):
    ctx0, f = learned()
    state = _state_for(ctx0, f)
    r = jump_lib.jump_drift(state)
    # The probe loss falls all the way along the drift: the longest admitted k wins.
    target = jax.tree.map(lambda p, d: p + 1000.0 * d, _params(), r)
    ctx = _context(_quadratic_towards(target))
    new, _ = self.variant(functools.partial(jump_lib.jump_step, ctx))(state, {"x": jnp.zeros(1)}, None)
    k = int(new.method.tracker.last_jump_k)
    assert k == max(HORIZONS)
    s_g = np.asarray(new.method.forecast.last_scale)
    np.testing.assert_allclose(s_g, RATIOS, atol=0.25)
    for g, (name, leaf) in enumerate((("a", "kernel"), ("b", "bias"))):
      moved = new.train.params[name][leaf] - state.train.params[name][leaf]
      chex.assert_trees_all_close(moved, s_g[g] * k * r[name][leaf], rtol=1e-4, atol=1e-7)
    assert float(new.method.forecast.expected_gain) == float(new.method.forecast.last_expected) > 0
    # The jump's move is recorded, so the interval's realised ratio leaves it out.
    assert np.all(np.asarray(new.method.forecast.jump_dot) != 0)

  def test_without_the_ensembles_agreement_nothing_jumps_and_the_train_state_is_bit_identical(self):
    ctx0, f = learned()
    state = _state_for(ctx0, f)
    target = jax.tree.map(lambda p, d: p + 1000.0 * d, _params(), jump_lib.jump_drift(state))
    ctx = _context(_quadratic_towards(target), min_agreement=1.0 + 1e-6)  # no agreement is enough
    new, _ = jump_lib.jump_step(ctx, state, {"x": jnp.zeros(1)}, None)
    chex.assert_trees_all_equal((new.train, new.method.drift_memory), (state.train, state.method.drift_memory))
    chex.assert_trees_all_equal(new.method.forecast.jump_dot, state.method.forecast.jump_dot)
    assert int(new.method.tracker.last_jump_k) == 0 and int(new.method.tracker.jump_attempts) == 1

  def test_an_untrained_forecaster_admits_nothing(self):
    ctx0 = _context(_quadratic_towards(_params()))
    f = forecast_lib.init_forecast(ctx0.settings.forecast, _params(), jax.random.PRNGKey(0))
    state = _state_for(ctx0, f)
    target = jax.tree.map(lambda p, d: p + 1000.0 * d, _params(), jump_lib.jump_drift(state))
    new, _ = jump_lib.jump_step(_context(_quadratic_towards(target)), state, {"x": jnp.zeros(1)}, None)
    chex.assert_trees_all_equal(new.train, state.train)


def test_calibration_learns_the_realised_over_expected_gain_of_closed_jumps():
  ctx = _context(_quadratic_towards(_params()))
  f = forecast_lib.init_forecast(ctx.settings.forecast, _params(), jax.random.PRNGKey(0))
  f = f.replace(expected_gain=jnp.float32(0.04))
  same = forecast_lib.calibrate(f, jnp.float32(0.02), jnp.asarray(False))
  chex.assert_trees_all_equal(same, f)
  half = forecast_lib.calibrate(f, jnp.float32(0.02), jnp.asarray(True))
  np.testing.assert_allclose(float(half.calibration), 0.7 * 1.0 + 0.3 * 0.5, rtol=1e-6)
  assert int(half.calibration_count) == 1


def test_the_forecaster_adds_one_params_sized_buffer_and_few_leaves():
  def sizes(width):
    params = {"a": {"kernel": jnp.zeros((width, 8))}, "b": {"bias": jnp.zeros((8,))}}
    ctx = _context(_quadratic_towards(params), params=params)
    s = jax.eval_shape(lambda: step_lib.init_hybrid_state(ctx, params, jax.random.PRNGKey(0)))
    assert not hasattr(s.method, "velocity")  # the jump's own state: no velocity, RSSM or history
    nbytes = lambda t: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(t))  # noqa: E731
    assert nbytes(s.method.forecast.snapshot_drift) == nbytes(params)
    # The RSSM (params, Adam, recurrent state) is one raveled vector.
    assert s.method.forecast.dynamics.ndim == 1
    n_leaves = len(jax.tree.leaves(s.method.forecast)) - len(jax.tree.leaves(params))
    return nbytes(s) - nbytes(s.train), nbytes(params), n_leaves

  (small, p_small, leaves), (big, p_big, _) = sizes(4), sizes(400)
  # Two buffers grow with the model: the slow EMA and the snapshot drift (the contract's two).
  assert big - small == 2 * (p_big - p_small)
  assert leaves <= 20


def _forecast_config(steps=120):
  c = micro_config("hybrid", steps=steps)
  c.trainer.update(averaging="ema", averaging_beta=0.9)
  c.hybrid.update(method="jump", warmup_steps=10, full_steps=5)
  c.hybrid.health.cooldown_steps = 5
  c.hybrid.jump.update(horizons=(4, 8), every=10, margin=-0.5, stop_fraction=0.8, forecast="rssm")
  c.hybrid.jump.forecaster.update(every=5, history=8, train_steps=2, min_agreement=0.0, deter=8, latent=4, hidden=8)
  return c


def test_forecast_with_outer_momentum_is_refused_naming_the_fields():
  c = _forecast_config()
  c.optim.outer_every = 10
  with pytest.raises(ValueError, match=r"hybrid\.jump\.forecast='rssm'.*optim\.outer_every=0"):
    preflight.validate(c)


@pytest.mark.slow  # three end-to-end runs; CI runs the slow tests
def test_a_forecast_run_resumes_bit_exact_with_flat_memory(tmp_path, jax_cache):
  c = cached(_forecast_config(steps=90), jax_cache)
  c.trainer.update(checkpoint_every=30)
  straight, resumed, a = straight_and_resumed(c, tmp_path, stop_after=50)  # resumed from step 30, bit for bit
  assert int(a.method.forecast.history.count) > 3  # snapshots were taken and the RSSM trained on them
  assert straight["jump_attempts"] > 0 and resumed["jumps"] == straight["jumps"]
  assert straight["memory"]["growth_bytes"] == 0


@pytest.mark.slow  # two compilations of a 256-wide model; CI runs the slow tests
def test_params_sized_copies_happen_only_inside_the_snapshot():
  """The forecaster's snapshot runs in a one-trip while loop inside the real step. Outside it, the
  fused step copies no params-sized buffer more than without the forecaster (a `lax.cond` would
  copy the snapshot drift at every step); inside it (one real step in `every`), XLA copies the old
  and the new drift once each."""
  from hybridjax import memory

  def compiled_hlo(forecast):
    h = small_hybrid_config(method="jump")
    h.jump.forecast = forecast
    h.jump.forecaster.update(deter=8, latent=4, hidden=8, history=8)
    compiled, state = compile_fused_mlp_step(h, width=256)
    flat = None if state.method.forecast is None else state.method.forecast.dynamics.shape[0]
    return compiled.as_text(), flat

  big = 256 * 256 * 4  # the largest params leaf's bytes

  def big_copies(text, flat):
    """(params-sized copies in the snapshot's loop body, whose carry is (run?, the forecaster's
    state: the raveled RSSM first), the others)."""
    headers = {line.split(" ", 1)[0][1:]: line for line in text.splitlines() if line.startswith("%")}
    inside, outside = [], []
    for c in memory.list_copies(text):
      if c["bytes"] >= big:
        in_snapshot = flat is not None and f"(pred[], f32[{flat}]," in headers.get(c["computation"], "")
        (inside if in_snapshot else outside).append(c)
    return inside, outside

  base_text, _ = compiled_hlo("none")
  text, flat = compiled_hlo("rssm")
  assert memory.count_copies(text, entry_only=True)[1] <= 1024
  inside, outside = big_copies(text, flat)
  assert len(outside) == len(big_copies(base_text, None)[1]), outside
  assert len(inside) <= 4, inside  # the old and the new drift, in each of the two real transitions
