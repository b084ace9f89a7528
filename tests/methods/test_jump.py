"""The jump predictor (`hybrid.method='jump'`): the drift estimate, the jump's move and schedule
advance, rejection leaving the state bit-identical, the skip control, its state's buffers, its
compiled step's copies, and its life in the training loop (counters, events, resume)."""

from __future__ import annotations

import dataclasses
import functools
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
  cached,
  compile_fused_mlp_step,
  micro_config,
  restore_latest,
  small_hybrid_config,
  straight_and_resumed,
)
from conftest import run_experiment as _run

from hybridjax import config as config_lib
from hybridjax import memory, optim, preflight
from hybridjax.hybrid import step as step_lib
from hybridjax.hybrid.phases import Branch
from hybridjax.loop import drivers
from hybridjax.methods.jump import steps as jump_lib

TOTAL = 1000
HORIZONS = (10, 20, 40)


def _params():
  return {"a": {"kernel": jnp.arange(6.0).reshape(3, 2) / 10}, "b": {"bias": jnp.array([0.5, -0.25])}}


def _context(loss_fn, *, skip_control=False, params=None, scales=(1.0,), trend_credit=0.0):
  h = small_hybrid_config(method="jump", grouping="leaf")
  h.jump.update(horizons=HORIZONS, scales=scales, margin=0.01, skip_control=skip_control, trend_credit=trend_credit)
  return drivers.make_context(
    h,
    loss_fn=loss_fn,
    tx=optim.make_optimizer(config_lib.default_optim_config()),
    params_shape=_params() if params is None else params,
    total_steps=TOTAL,
    averaging_beta=0.9,
  )


def _state(ctx, step=100):
  """A state at schedule step `step` whose fast and slow EMAs differ by known offsets."""
  p = _params()
  s = step_lib.init_hybrid_state(ctx, p, jax.random.PRNGKey(0))
  fast = jax.tree.map(lambda x: x + 0.3 + 0.01 * jnp.arange(x.size, dtype=x.dtype).reshape(x.shape), p)
  slow = jax.tree.map(lambda x: x - 0.2, p)
  train = s.train.replace(step=jnp.asarray(step, jnp.int32), averaging=s.train.averaging.replace(params=fast))
  return s.replace(train=train, method=s.method.replace(drift_memory=s.method.drift_memory.replace(params=slow)))


def _quadratic_towards(target):
  def loss_fn(params, batch):
    del batch
    sq = jax.tree.map(lambda p, t: jnp.sum(jnp.square(p - t)), params, target)
    return sum(jax.tree.leaves(sq)), None

  return loss_fn


def _drift(state):
  return jump_lib.drift_per_step(state.train.averaging, state.method.drift_memory, state.train.step)


BATCH = {"x": jnp.zeros((1,))}


class DriftTest(chex.TestCase):
  def test_ema_lag_is_zero_after_one_step_and_tends_to_beta_over_one_minus_beta(self):
    np.testing.assert_allclose(jump_lib.ema_lag(0.9, 1), 0.0, atol=1e-6)
    np.testing.assert_allclose(jump_lib.ema_lag(0.9, 10_000), 9.0, rtol=1e-5)
    lags = [float(jump_lib.ema_lag(0.99, n)) for n in (1, 10, 100, 1000)]
    assert lags == sorted(lags)

  @chex.variants(with_jit=True, without_jit=True)
  def test_drift_of_two_bias_corrected_emas_of_a_constant_velocity_is_that_velocity(self):
    p0 = {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array(3.0)}
    v = {"w": jnp.array([0.01, 0.02, -0.03]), "b": jnp.array(-0.005)}
    fast = optim.Averaging(params=p0, beta=jnp.asarray(0.9, jnp.float32))
    slow = jump_lib.init_drift_memory(p0, 0.98)
    for n in range(1, 41):
      theta = jax.tree.map(lambda p, u, n=n: p + n * u, p0, v)
      fast, slow = optim.update_average(fast, theta, n + 1), optim.update_average(slow, theta, n + 1)
    r = self.variant(jump_lib.drift_per_step)(fast, slow, jnp.asarray(41))
    chex.assert_trees_all_close(r, v, rtol=2e-3, atol=2e-6)


class JumpStepTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_a_jump_moves_every_leaf_of_group_g_by_s_g_k_r_g_and_advances_the_schedule_by_k(self):
    ctx0 = _context(_quadratic_towards(_params()))
    state = _state(ctx0)
    r = _drift(state)
    # The loss falls all the way along the drift: the longest horizon wins.
    target = jax.tree.map(lambda p, d: p + 1000.0 * d, _params(), r)
    ctx = _context(_quadratic_towards(target))
    scale = jnp.asarray([0.5, 2.0])  # s_g per group ('leaf' grouping: a/kernel, b/bias)
    assert ctx.groups.names == ("a/kernel", "b/bias")
    state = state.replace(method=state.method.replace(tracker=state.method.tracker.replace(group_scale=scale)))
    new, info = self.variant(functools.partial(jump_lib.jump_step, ctx))(state, BATCH, None)
    k = max(HORIZONS)
    for g, (name, leaf) in enumerate((("a", "kernel"), ("b", "bias"))):
      moved = scale[g] * k * r[name][leaf]
      chex.assert_trees_all_close(new.train.params[name][leaf] - state.train.params[name][leaf], moved, rtol=1e-5)
      chex.assert_trees_all_close(
        new.train.averaging.params[name][leaf] - state.train.averaging.params[name][leaf], moved, rtol=1e-5
      )
      chex.assert_trees_all_close(
        new.method.drift_memory.params[name][leaf] - state.method.drift_memory.params[name][leaf], moved, rtol=1e-5
      )
    assert int(new.train.step) == int(state.train.step) + k
    chex.assert_trees_all_equal(new.train.opt_state, state.train.opt_state)  # Adam's moments are kept
    c = new.method.tracker
    assert (int(c.jumps), int(c.jump_attempts), int(c.jump_steps), int(c.last_jump_k)) == (1, 1, k, k)
    assert not bool(info.batch_consumed) and int(info.forwards) == 1 + len(HORIZONS)
    assert float(c.last_probe_gain) > 0.01
    # The translation keeps the EMAs' difference, so the drift (at the same count) as it was.
    kept = jump_lib.drift_per_step(new.train.averaging, new.method.drift_memory, state.train.step)
    chex.assert_trees_all_close(kept, r, rtol=1e-4, atol=1e-6)

  def test_the_probe_chooses_the_move_scale_and_the_schedule_still_advances_by_k(self):
    state = _state(_context(_quadratic_towards(_params())))
    r = _drift(state)
    # Moves s k of 7.5, 10, 15, 20, 30, 40 steps of drift; the loss is lowest exactly 30 steps ahead:
    # the candidate (k 40, s 0.75), which skips 40 schedule steps.
    target = jax.tree.map(lambda p, d: p + 30.0 * d, _params(), r)
    ctx = _context(_quadratic_towards(target), scales=(0.75, 1.0))
    new, info = jump_lib.jump_step(ctx, state, BATCH, None)
    assert int(new.train.step) == int(state.train.step) + 40
    assert float(new.method.tracker.last_jump_scale) == 0.75
    moved = jax.tree.map(lambda d: 30.0 * d, r)
    chex.assert_trees_all_close(jax.tree.map(jnp.subtract, new.train.params, state.train.params), moved, rtol=1e-5)
    assert int(info.forwards) == 1 + 3 * 2

  @chex.variants(with_jit=True, without_jit=True)
  def test_a_rejected_jump_leaves_the_state_bit_identical(self):
    ctx0 = _context(_quadratic_towards(_params()))
    state = _state(ctx0)
    r = _drift(state)
    # Every candidate is worse than standing still.
    target = jax.tree.map(lambda p, d: p - 1000.0 * d, _params(), r)
    ctx = _context(_quadratic_towards(target))
    new, info = self.variant(functools.partial(jump_lib.jump_step, ctx))(state, BATCH, None)
    chex.assert_trees_all_equal(new.train, state.train)
    chex.assert_trees_all_equal(new.method.drift_memory, state.method.drift_memory)
    chex.assert_trees_all_equal((new.controller, new.rng), (state.controller, state.rng))
    t = new.method.tracker
    assert (int(t.jumps), int(t.jump_attempts), int(t.last_jump_k)) == (0, 1, 0)
    assert int(info.forwards) == 1 + len(HORIZONS)  # the probes are counted all the same

  def test_with_trend_credit_a_jump_must_beat_the_progress_of_the_steps_it_skips(self):
    state = _state(_context(_quadratic_towards(_params())))
    target = jax.tree.map(lambda p, d: p + 1000.0 * d, _params(), _drift(state))
    # A log-loss falling 0.01 per real step before the jump (the controller's two loss EMAs).
    lag_fast, lag_slow = 0.7 / 0.3, 0.97 / 0.03
    falling = state.controller.replace(
      ema_fast=jnp.float32(1.0), ema_slow=jnp.float32(1.0 + 0.01 * (lag_slow - lag_fast))
    )
    state = state.replace(controller=falling)
    amounts = state.method.tracker.group_scale[None, :] * jnp.asarray(HORIZONS, jnp.float32)[:, None]
    base, losses = jump_lib.score_candidates(
      _context(_quadratic_towards(target)), state.train.params, _drift(state), amounts, BATCH
    )
    gains = np.log(np.asarray(base)) - np.log(np.asarray(losses))  # log-loss drop of k = 10, 20, 40
    assert np.all(gains > 0)
    outcomes = set()
    for credit in (0.0, 0.5, 1.0, 4.0, 50.0):
      new, _ = jump_lib.jump_step(_context(_quadratic_towards(target), trend_credit=credit), state, BATCH, None)
      worth = gains - credit * 0.01 * np.asarray(HORIZONS)  # the excess over the skipped steps' progress
      k = int(new.method.tracker.last_jump_k)
      outcomes.add(k)
      if worth.max() > 0:
        assert k == HORIZONS[int(np.argmax(worth))], (credit, worth)
      else:
        assert k == 0, (credit, worth)
        chex.assert_trees_all_equal(new.train, state.train)
    assert 0 in outcomes and len(outcomes) >= 2, outcomes  # both accepted and rejected jumps were seen

  def test_outside_the_window_nothing_jumps(self):
    ctx0 = _context(_quadratic_towards(_params()))
    state = _state(ctx0, step=TOTAL - 100)  # past stop_fraction
    target = jax.tree.map(lambda p, d: p + 1000.0 * d, _params(), _drift(state))
    new, _ = jump_lib.jump_step(_context(_quadratic_towards(target)), state, BATCH, None)
    chex.assert_trees_all_equal(new.train, state.train)

  def test_the_skip_control_advances_the_schedule_and_moves_no_weight(self):
    ctx0 = _context(_quadratic_towards(_params()))
    state = _state(ctx0)
    target = jax.tree.map(lambda p, d: p + 1000.0 * d, _params(), _drift(state))
    ctx = _context(_quadratic_towards(target), skip_control=True)
    new, _ = jump_lib.jump_step(ctx, state, BATCH, None)
    assert int(new.train.step) == int(state.train.step) + max(HORIZONS)
    chex.assert_trees_all_close(new.train.params, state.train.params, rtol=0, atol=0)
    chex.assert_trees_all_close(new.train.averaging.params, state.train.averaging.params, rtol=0, atol=0)

  def test_with_outer_momentum_the_drift_is_m_times_one_minus_mu_over_k_and_its_anchor_moves_too(self):
    h = small_hybrid_config(method="jump", grouping="leaf")
    h.jump.update(horizons=HORIZONS, margin=0.01)
    p = _params()
    probe = drivers.make_context(
      h,
      loss_fn=_quadratic_towards(p),
      tx=optim.make_optimizer(config_lib.default_optim_config()),
      params_shape=p,
      total_steps=TOTAL,
      averaging_beta=0.9,
      outer=(10, 0.8, 0.5),
    )
    s = step_lib.init_hybrid_state(probe, p, jax.random.PRNGKey(0))
    assert s.method.drift_memory is None and s.train.outer is not None  # m and slow: the two buffers
    m = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), p)
    s = s.replace(train=s.train.replace(step=jnp.asarray(100, jnp.int32), outer=s.train.outer.replace(momentum=m)))
    r = jax.tree.map(lambda x: x * (1 - 0.5) / 10, m)
    chex.assert_trees_all_close(jump_lib.jump_drift(s), r)
    target = jax.tree.map(lambda x, d: x + 1000.0 * d, p, r)
    ctx = dataclasses.replace(probe, loss_fn=_quadratic_towards(target))
    new, _ = jump_lib.jump_step(ctx, s, BATCH, None)
    k = max(HORIZONS)
    moved = jax.tree.map(lambda d: k * d, r)
    chex.assert_trees_all_close(jax.tree.map(jnp.subtract, new.train.params, s.train.params), moved, rtol=1e-5)
    chex.assert_trees_all_close(jax.tree.map(jnp.subtract, new.train.outer.slow, s.train.outer.slow), moved, rtol=1e-5)
    chex.assert_trees_all_equal(new.train.outer.momentum, m)

  def test_the_state_holds_one_params_sized_buffer_beyond_the_train_state_and_no_velocity(self):
    def overhead(width):
      params = {"a": {"kernel": jnp.zeros((width, 8))}, "b": {"bias": jnp.zeros((8,))}}
      ctx = _context(_quadratic_towards(params), params=params)
      s = jax.eval_shape(lambda: step_lib.init_hybrid_state(ctx, params, jax.random.PRNGKey(0)))
      assert not hasattr(s.method, "velocity")
      nbytes = lambda t: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(t))  # noqa: E731
      assert nbytes(s.method.drift_memory) == nbytes(params) + 4  # the slow EMA and its beta
      return nbytes(s) - nbytes(s.train), nbytes(params)

    (small, p_small), (big, p_big) = overhead(4), overhead(400)
    # Only one buffer grows with the model: the slow EMA. (The averaging EMA, the fast one, is part
    # of the train state, as in the averaged baseline.)
    assert big - small == p_big - p_small


def test_the_fused_jump_step_copies_no_state_outside_the_transitions():
  compiled, _ = compile_fused_mlp_step(small_hybrid_config(method="jump"))
  _, nbytes = memory.count_copies(compiled, entry_only=True)
  assert nbytes <= 1024


# --- through the training loop -----------------------------------------------------------------


def _jump_config(steps=120, **jump):
  c = micro_config("hybrid", steps=steps)
  c.trainer.update(averaging="ema", averaging_beta=0.9)
  c.hybrid.update(method="jump", warmup_steps=10, full_steps=5)
  c.hybrid.health.cooldown_steps = 5  # a jump of this micro model can trip the gradient check: jump again soon
  c.hybrid.jump.update(
    horizons=(4, 8, 16), every=10, margin=-0.5, stop_fraction=0.8, **jump
  )  # margin < 0: always accept
  return c


def _records(workdir, kind):
  with open(workdir / "metrics.jsonl") as f:
    return [r for r in map(json.loads, f) if r.get("kind", "train") == kind]


@pytest.mark.slow  # the default suite trains jump runs through `train()` in tests/bench/test_benchmark.py
def test_a_jump_run_counts_backward_passes_batches_and_skipped_steps(tmp_path, jax_cache):
  c = cached(_jump_config(), jax_cache)
  c.trainer.update(eval_every=25, log_every=10)
  s = _run(c, tmp_path / "run")
  assert s["jumps"] > 0 and s["jump_steps"] > 0
  assert s["backward_passes"] + s["jump_steps"] == c.trainer.steps  # the schedule ends on time
  assert s["batches"] == s["backward_passes"]  # a jump uses no batch
  assert s["probe_forwards"] == s["jump_attempts"] * (1 + 3)
  assert s["mean_persisting_gain"] is not None
  # Evals fire when the schedule step crosses their interval, jumps or not.
  evals = [r["step"] for r in _records(tmp_path / "run", "eval")]
  assert [e // 25 for e in evals[:-1]] == list(range(1, len(evals))) and evals[-1] == c.trainer.steps
  jumps = [r for r in _records(tmp_path / "run", "step") if r.get("jump_k")]
  assert len(jumps) == s["jumps"] and sum(r["jump_k"] for r in jumps) == s["jump_steps"]


@pytest.mark.cross_program
@pytest.mark.slow  # two end-to-end runs; CI runs the slow tests
def test_with_prediction_off_the_jump_predictor_is_the_averaged_baseline_bit_for_bit(tmp_path, jax_cache):
  base = cached(micro_config(steps=30), jax_cache)
  base.trainer.update(averaging="ema", averaging_beta=0.9)
  _run(base, tmp_path / "base")
  hyb = cached(_jump_config(steps=30), jax_cache)
  hyb.hybrid.enable_predict = False
  _run(hyb, tmp_path / "hyb")
  b, h = restore_latest(tmp_path / "base", base)[1], restore_latest(tmp_path / "hyb", hyb)[1]
  chex.assert_trees_all_equal((h.train.params, h.train.averaging), (b.params, b.averaging))


@pytest.mark.slow  # three end-to-end runs; CI runs the slow tests
def test_resume_across_jumps_is_bit_exact(tmp_path, jax_cache):
  c = cached(_jump_config(steps=90), jax_cache)
  c.trainer.update(checkpoint_every=30)
  straight, resumed, a = straight_and_resumed(c, tmp_path, stop_after=50)  # resumed from step 30, bit for bit
  assert straight["jumps"] >= 2 and resumed["jumps"] == straight["jumps"]
  assert straight["memory"]["growth_bytes"] == 0


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("hybrid.jump.horizons", (), "hybrid.jump.horizons"),
    ("hybrid.jump.horizons", (0, 10), "hybrid.jump.horizons"),
    ("hybrid.jump.stop_fraction", 0.01, "start_fraction"),
    ("trainer.averaging", "none", "trainer.averaging='ema'"),
    ("hybrid.steps_per_call", 4, "steps_per_call=1"),
    ("trainer.averaging_beta", 0.998, "hybrid.jump.slow_beta"),  # the slow EMA would not be slower
    ("hybrid.jump.horizons", (4, 8, 91), "never fits this run's jump window"),  # 6 + 91 > 96 of 120 steps
  ],
)
def test_bad_jump_settings_are_refused_naming_the_field(field, value, match):
  c = _jump_config()
  if field == "hybrid.steps_per_call":
    c.hybrid.dispatch = "switch"
  c.update_from_flattened_dict({field: value})
  with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
    preflight.validate(c)


@pytest.mark.parametrize(
  "setting, fix",
  [
    ({"hybrid.jump.slow_lag_ratio": 2.0}, "--config.hybrid.jump.slow_lag_ratio=0"),
    ({"optim.outer_every": 10}, "--config.optim.outer_every=0"),
  ],
)
def test_a_slow_beta_that_nothing_reads_is_refused(setting, fix):
  """With a lag ratio (as every benchmark preset sets) or outer momentum, the slow EMA's beta is not
  `hybrid.jump.slow_beta`: a value set there trained nothing and would be recorded as the run's."""
  c = _jump_config()
  c.update_from_flattened_dict(setting)
  preflight.validate(c)  # at the default slow_beta the setting is valid
  c.hybrid.jump.slow_beta = 0.995
  with pytest.raises(ValueError, match=r"hybrid\.jump\.slow_beta \(0\.995\) is set but unused") as e:
    preflight.validate(c)
  assert fix in str(e.value)
  c.update_from_flattened_dict({k: 0 for k in setting})
  preflight.validate(c)  # without them, slow_beta is the slow EMA's beta


def test_the_branch_of_a_jump_is_the_predict_step():
  # The jump step, behind the framework's non-finite guard (`step.discard_nonfinite`).
  branch = step_lib.transitions(_context(_quadratic_towards(_params())))[Branch.PREDICT_STEP]
  assert branch.__wrapped__ is jump_lib.jump_step
