"""The hybrid core: equivalence with the baseline, predicted steps, rollback, controller, variants."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import STD, micro_config, small_hybrid_config
from hybridjax import config as config_lib
from hybridjax import controller as controller_lib
from hybridjax import features as features_lib
from hybridjax import state as state_lib
from hybridjax import steps as steps_lib
from hybridjax import trainer
from hybridjax.models import mlp


def _mlp_problem(seed=0):
  model = mlp.MLP(features=(16, 16), n_out=1)
  x, y = mlp.make_regression_problem(seed, n_in=4)
  params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 4)))["params"]
  batch = lambda i: mlp.regression_batch(x, y, step=i, batch_size=32, seed=seed)  # noqa: E731
  return mlp.make_loss_fn(model), params, batch


# One MLP problem and optimizer for the whole module, so compiled step functions are shared
# between tests (compiling the RSSM dominates this file's run time).
LOSS_FN, PARAMS, BATCH = _mlp_problem()
TX = None


def _optimizer(steps=200, lr=1e-2):
  c = config_lib.default_optim_config()
  c.learning_rate, c.warmup_steps = lr, 5
  return trainer.make_optimizer(c, steps)


TX = _optimizer()
_CTX_CACHE: dict = {}


def _ctx(loss_fn, params, tx, steps=200, **overrides):
  key = (id(loss_fn), id(tx), steps, tuple(sorted(overrides.items())))
  if key not in _CTX_CACHE:
    ctx = steps_lib.make_context(small_hybrid_config(**overrides), loss_fn=loss_fn, tx=tx,
                                 params_shape=params, total_steps=steps)
    fns = [jax.jit(steps_lib.make_phase_step(ctx, b)) for b in range(state_lib.N_BRANCHES)]
    fused = jax.jit(lambda s, b: steps_lib.hybrid_step(ctx, s, b))
    predict = jax.jit(lambda s, b: steps_lib.predict_step(ctx, s, b))
    _CTX_CACHE[key] = ctx
    _COMPILED[id(ctx)] = (fns, fused, predict)
  return _CTX_CACHE[key]


_COMPILED: dict = {}


def _predict_fn(ctx):
  return _COMPILED[id(ctx)][2]


def _run_hybrid(ctx, params, batch, n, rng=0, dispatch="host", state=None):
  state = state if state is not None else steps_lib.init_hybrid_state(ctx, params, jax.random.PRNGKey(rng))
  fns, fused, _ = _COMPILED[id(ctx)]
  trace = []
  for i in range(n):
    if dispatch == "host":
      state, m = fns[int(state.controller.next_branch)](state, batch(i))
    else:
      state, m = fused(state, batch(i))
    trace.append(jax.device_get(m))
  return state, trace


def test_param_groups_by_kind():
  from hybridjax.models import gpt2
  cfg = gpt2.PRESETS["tiny"]
  shapes = jax.eval_shape(lambda: gpt2.GPT2(cfg).init(jax.random.PRNGKey(0),
                                                      jnp.zeros((1, 8), jnp.int32))["params"])
  g = features_lib.param_groups(shapes, "kind")
  assert g.n_groups == 16  # wte, wpe, ln_f (2), and 12 per-block kinds shared by both blocks
  assert "h_*/attn/c_attn/kernel" in g.names
  assert features_lib.param_groups(shapes, "leaf").n_groups == len(jax.tree.leaves(shapes))
  assert features_lib.param_groups(shapes, "global").n_groups == 1


def test_disabled_prediction_equals_baseline_bit_exactly():
  loss_fn, params, batch = LOSS_FN, PARAMS, BATCH
  tx = TX
  ctx = _ctx(loss_fn, params, tx, enable_predict=False)
  state, trace = _run_hybrid(ctx, params, batch, 50)
  base = trainer.init_train_state(params, tx)
  step = jax.jit(lambda s, b: trainer.train_step(s, b, loss_fn=loss_fn, tx=tx))
  for i in range(50):
    base, _ = step(base, batch(i))
  assert {int(m["phase"]) for m in trace} <= {state_lib.WARMUP, state_lib.FULL}
  chex.assert_trees_all_equal(state.train.params, base.params)
  chex.assert_trees_all_equal(state.train.opt_state, base.opt_state)


def _state_in_predict(ctx, params, batch, warm_steps=30):
  """A state after `warm_steps` real steps, switched to PREDICT with a known plan."""
  state, _ = _run_hybrid(ctx, params, batch, warm_steps)
  g = ctx.groups.n_groups
  alpha = jnp.linspace(0.5, 1.5, ctx.hmax * g).reshape(ctx.hmax, g)
  c = state.controller.replace(phase=jnp.int32(state_lib.PREDICT), steps_in_phase=jnp.int32(0),
                               plan_offset=jnp.int32(0), horizon=jnp.int32(ctx.hmax),
                               plan_alpha=alpha, alpha_since_good=jnp.zeros((g,)),
                               next_branch=jnp.int32(state_lib.BRANCH_PREDICT))
  return state.replace(controller=c), alpha


def test_predicted_step_moves_every_parameter_by_alpha_velocity():
  loss_fn, params, batch = LOSS_FN, PARAMS, BATCH
  ctx = _ctx(loss_fn, params, TX, **STD)
  state, alpha = _state_in_predict(ctx, params, batch)
  before = jax.device_get(state.train.params)
  velocity = jax.device_get(state.velocity)
  opt_before = jax.device_get(state.train.opt_state)
  new, info = _predict_fn(ctx)(state, batch(100))
  after = jax.device_get(new.train.params)
  for gi, (p0, p1, v) in enumerate(zip(jax.tree.leaves(before), jax.tree.leaves(after),
                                       jax.tree.leaves(velocity))):
    assert np.all(p1 != p0), f"leaf {ctx.groups.names[gi]} did not move in a predicted step"
    a = np.float32(alpha[0, gi])
    chex.assert_trees_all_close(p1, p0 + a * v, rtol=1e-6, atol=1e-9)
    # The displacement is alpha * velocity up to the rounding of p0 (float32 eps * |p0|).
    chex.assert_trees_all_close(p1 - p0, a * v, rtol=1e-5, atol=2e-7 * float(np.abs(p0).max()))
  chex.assert_trees_all_equal(new.train.opt_state, opt_before)  # the optimizer is not touched
  assert not bool(info["was_real"])


def test_rollback_is_exact_without_snapshot():
  loss_fn, params, batch = LOSS_FN, PARAMS, BATCH
  ctx = _ctx(loss_fn, params, TX, **STD)
  state, alpha = _state_in_predict(ctx, params, batch)
  start = jax.device_get(state.train.params)
  pstep = _predict_fn(ctx)
  n = ctx.hmax - 1
  for k in range(n):
    state, _ = pstep(state, batch(200 + k))
    state = state.replace(controller=state.controller.replace(
        steps_in_phase=state.controller.steps_in_phase + 1))
  moved = jax.device_get(state.train.params)
  for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(start)):
    assert np.all(a != b)
  # The segment is sum_k alpha_k . velocity: subtracting the summed alphas undoes it.
  back = steps_lib.rollback_params(ctx, state.train.params, state.velocity,
                                   jnp.sum(alpha[:n], axis=0))
  chex.assert_trees_all_close(back, start, rtol=1e-5, atol=1e-6)


def test_predicted_steps_extrapolate_a_linear_trajectory():
  # Loss linear in the params: SGD takes the same update every step, so the trajectory is a line
  # and alpha = 1 along the velocity must land where the real steps land.
  c = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
  params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros((4,))}
  loss_fn = lambda p, b: (100.0 + jnp.sum(c * p["w"]) + jnp.sum(p["b"]), {})  # noqa: E731
  tx = optax.sgd(1e-2)
  ctx = _ctx(loss_fn, params, tx, constant_alpha=1.0, velocity_beta=0.5, max_predict_steps=8,
             enable_predict=False)
  batch = lambda i: {}  # noqa: E731
  state, _ = _run_hybrid(ctx, params, batch, 40)
  real_state, _ = _run_hybrid(ctx, params, batch, 48)
  g = ctx.groups.n_groups
  c_ = state.controller.replace(phase=jnp.int32(state_lib.PREDICT), steps_in_phase=jnp.int32(0),
                                plan_offset=jnp.int32(0), horizon=jnp.int32(8),
                                plan_alpha=jnp.ones((8, g)))
  state = state.replace(controller=c_)
  pstep = _predict_fn(ctx)
  for k in range(8):
    state, _ = pstep(state, {})
    state = state.replace(controller=state.controller.replace(
        steps_in_phase=state.controller.steps_in_phase + 1))
  chex.assert_trees_all_close(state.train.params, real_state.train.params, rtol=1e-4, atol=1e-6)


def test_nan_loss_forces_full_and_applies_no_update():
  loss_fn, params, batch = LOSS_FN, PARAMS, BATCH
  bad_step = 25

  def faulty_loss(p, b):
    loss, aux = loss_fn(p, b)
    return jnp.where(b["step"] == bad_step, jnp.nan, loss), aux

  def batch_with_step(i):
    return dict(batch(i), step=np.int32(i))

  ctx = _ctx(faulty_loss, params, TX, confidence_threshold=0.0)
  state, trace = _run_hybrid(ctx, params, batch_with_step, bad_step)
  fns = [jax.jit(steps_lib.make_phase_step(ctx, b)) for b in range(state_lib.N_BRANCHES)]
  # Run until the bad batch lands on a real step.
  i = bad_step
  before = jax.device_get(state.train.params)
  branch = int(state.controller.next_branch)
  state, m = fns[branch](state, batch_with_step(i))
  if branch == state_lib.BRANCH_REAL:
    chex.assert_trees_all_equal(jax.device_get(state.train.params), before)
    assert int(state.controller.events[0]) == 1
    assert int(state.controller.phase) in (state_lib.FULL, state_lib.WARMUP)
    assert int(state.controller.cooldown) > 0
  for leaf in jax.tree.leaves(state.train.params):
    assert np.all(np.isfinite(leaf))


def test_hybrid_moves_through_all_phases_and_horizon_is_bounded():
  loss_fn, params, batch = LOSS_FN, PARAMS, BATCH
  ctx = _ctx(loss_fn, params, TX, **STD)
  state, trace = _run_hybrid(ctx, params, batch, 150)
  phases = [int(m["phase"]) for m in trace]
  assert set(phases) == {0, 1, 2, 3}, phases
  _assert_legal_sequence(phases)
  assert max(int(m["horizon"]) for m in trace) <= 4
  c = state.controller
  assert int(c.phase_steps.sum()) == 150
  # Micro-corrections: every `correction_interval` predicted steps one real step (with a gradient)
  # runs inside the PREDICT phase.
  micro = [m for m in trace if int(m["phase"]) == state_lib.PREDICT and float(m["grad_norm"]) > 0]
  assert micro, "no micro-correction happened"
  assert int(c.backward_passes) == 150 - int(c.phase_steps[2]) + len(micro)


def _assert_legal_sequence(phases):
  allowed = {(0, 0), (0, 1), (1, 1), (1, 2), (2, 2), (2, 3), (3, 3), (3, 1), (3, 2), (1, 0)}
  for a, b in zip(phases, phases[1:]):
    assert (a, b) in allowed and not (a == 1 and b == 0), (a, b)


def test_fused_switch_equals_host_dispatch():
  loss_fn, params, batch = LOSS_FN, PARAMS, BATCH
  ctx = _ctx(loss_fn, params, TX, **STD)
  a, ta = _run_hybrid(ctx, params, batch, 60, dispatch="host")
  b, tb = _run_hybrid(ctx, params, batch, 60, dispatch="switch")
  assert [int(m["phase"]) for m in ta] == [int(m["phase"]) for m in tb]
  chex.assert_trees_all_close(a.train.params, b.train.params, rtol=1e-5, atol=1e-6)


def test_scan_over_k_steps_equals_single_steps():
  loss_fn, params, batch = LOSS_FN, PARAMS, BATCH
  ctx = _ctx(loss_fn, params, TX, **STD)
  a, _ = _run_hybrid(ctx, params, batch, 40, dispatch="switch")
  # The state is donated: give it its own copy of the module's shared params.
  s = steps_lib.init_hybrid_state(ctx, jax.tree.map(jnp.copy, params), jax.random.PRNGKey(0))
  multi = jax.jit(lambda s, b: steps_lib.hybrid_multi_step(ctx, s, b), donate_argnums=0)
  for start in range(0, 40, 8):
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *[batch(i) for i in range(start, start + 8)])
    s, m = multi(s, stacked)
    chex.assert_shape(m["loss"], (8,))
  chex.assert_trees_all_close(a.train.params, s.train.params, rtol=1e-5, atol=1e-6)


class StepVariantsTest(chex.TestCase):
  """Jit and no-jit agree. The real step is compared jitted only: run op by op, its RSSM training
  scan alone takes minutes, and it is covered by the fused-vs-host test above."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_predict_step_jit_and_nojit_agree(self):
    loss_fn, params, batch = LOSS_FN, PARAMS, BATCH
    ctx = _ctx(loss_fn, params, TX, **STD)
    pred_state, _ = _state_in_predict(ctx, params, batch, warm_steps=12)
    pred = self.variant(lambda s, b: steps_lib.predict_step(ctx, s, b))
    a, ia = pred(pred_state, batch(50))
    b, ib = _predict_fn(ctx)(pred_state, batch(50))
    chex.assert_trees_all_close(a.train.params, b.train.params, rtol=1e-6)
    chex.assert_trees_all_close(ia, ib, rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rollback_and_transition_jit_and_nojit_agree(self):
    ctx = _ctx(LOSS_FN, PARAMS, TX, **STD)
    g = ctx.groups.n_groups
    vel = jax.tree.map(jnp.ones_like, PARAMS)
    back = self.variant(lambda p, v, a: steps_lib.rollback_params(ctx, p, v, a))(
        PARAMS, vel, jnp.arange(g, dtype=jnp.float32))
    ref = jax.jit(lambda p, v, a: steps_lib.rollback_params(ctx, p, v, a))(
        PARAMS, vel, jnp.arange(g, dtype=jnp.float32))
    chex.assert_trees_all_close(back, ref)
    ctrl = state_lib.init_controller(max_predict_steps=4, n_groups=g, feature_dim=3,
                                     accuracy_window=4)
    kw = dict(was_real=jnp.bool_(True), finite=jnp.bool_(True), explosion=jnp.bool_(False),
              spike=jnp.bool_(False), validated=jnp.bool_(False), diverged=jnp.bool_(False),
              nonfinite_prediction=jnp.bool_(False), rollback_alpha=jnp.zeros((g,)))
    t = self.variant(lambda c: controller_lib.transition(c, s=ctx.control, **kw))
    chex.assert_trees_all_equal(t(ctrl), jax.jit(lambda c: controller_lib.transition(
        c, s=ctx.control, **kw))(ctrl))


# --- controller properties ------------------------------------------------------------------------

_SETTINGS = controller_lib.ControllerSettings(
    enable_predict=True, warmup_steps=3, full_steps=2, max_predict_steps=5,
    confidence_threshold=0.4, divergence_tolerance=0.05, correct_steps=2, correction_interval=0,
    validate_every=2, grad_explosion_factor=10.0, loss_spike_sigma=6.0, max_prediction_failures=2,
    cooldown_steps=4)

step_info = st.fixed_dictionaries({
    "confidence": st.floats(0.0, 1.0), "finite": st.booleans(), "explosion": st.booleans(),
    "spike": st.booleans(), "validated": st.booleans(), "diverged": st.booleans(),
    "nonfinite_prediction": st.booleans()})


@settings(max_examples=30, deadline=None)
@given(st.lists(step_info, min_size=1, max_size=40))
def test_controller_transitions_are_legal(infos):
  ctrl = state_lib.init_controller(max_predict_steps=5, n_groups=2, feature_dim=3,
                                   accuracy_window=4)
  phases = [0]
  transition = jax.jit(lambda c, **kw: controller_lib.transition(c, s=_SETTINGS, **kw))
  for info in infos:
    in_predict = int(ctrl.phase) == state_lib.PREDICT
    was_real = not in_predict
    ctrl = ctrl.replace(confidence=jnp.float32(info["confidence"]))
    ctrl = transition(
        ctrl, was_real=jnp.bool_(was_real), finite=jnp.bool_(info["finite"] or not was_real),
        explosion=jnp.bool_(info["explosion"] and was_real), spike=jnp.bool_(info["spike"] and was_real),
        validated=jnp.bool_(info["validated"] and in_predict),
        diverged=jnp.bool_(info["diverged"] and info["validated"] and in_predict),
        nonfinite_prediction=jnp.bool_(info["nonfinite_prediction"] and info["validated"] and in_predict),
        rollback_alpha=jnp.zeros((2,)))
    phases.append(int(ctrl.phase))
    assert 1 <= int(ctrl.horizon) <= 5
    if int(ctrl.phase) == state_lib.PREDICT:
      assert int(ctrl.cooldown) == 0
    if was_real and not (info["finite"]):  # a non-finite real step never leads into PREDICT
      assert int(ctrl.phase) != state_lib.PREDICT
  _assert_legal_sequence(phases)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 0.99), st.integers(1, 50))
def test_horizon_grows_with_confidence_and_is_bounded(conf, thr, hmax):
  s = controller_lib.ControllerSettings(**{**_SETTINGS.__dict__, "confidence_threshold": thr,
                                           "max_predict_steps": hmax})
  h = int(controller_lib.horizon_for(jnp.float32(conf), s))
  assert 1 <= h <= hmax
  h_hi = int(controller_lib.horizon_for(jnp.float32(min(conf + 0.1, 1.0)), s))
  assert h_hi >= h


@pytest.mark.slow
def test_tiny_gpt2_hybrid_run_close_to_baseline(tmp_path):
  from experiments import gpt2_small as experiment
  results = {}
  for mode in ("baseline", "hybrid"):
    c = micro_config(mode=mode, steps=120)
    c.hybrid.confidence_threshold = 0.2
    task = experiment.build_task(c)
    results[mode] = trainer.train(c, str(tmp_path / mode), init_params=task["init_params"],
                                  loss_fn=task["loss_fn"], train_batch=task["train_batch"],
                                  eval_batches=task["eval_batches"])
  base, hyb = results["baseline"]["final_eval_loss"], results["hybrid"]["final_eval_loss"]
  assert results["hybrid"]["predict_fraction"] > 0
  assert hyb <= 1.05 * base, (hyb, base)
  # Memory is logged at every phase transition, and the live arrays do not change across them.
  from hybridjax import writers
  events = [r for r in writers.read_jsonl(str(tmp_path / "hybrid" / "metrics.jsonl"))
            if r["kind"] == "memory"]
  assert {e["phase_to"] for e in events} >= {"FULL", "PREDICT", "CORRECT"}
  # (The first readings can still include garbage from start-up not yet collected: compare the
  # second half of the run, dozens of transitions.)
  later = [e for e in events if e["step"] > c.trainer.steps // 2]
  assert len(later) >= 5
  assert len({(e["live_arrays"], e["live_bytes"]) for e in later}) == 1, later
