"""The hybrid step (hybridjax.hybrid.step and its three transitions, full_step, predict_step and
correct_step): equivalence with the baseline, predicted steps, rollback, non-finite losses in every
branch, the phase cycle, and fused/scanned dispatch against host dispatch.

Everything runs on the MLP problem of tests/hybrid_helper.py with the module-wide config `hh.MAIN`.
"""

from __future__ import annotations

import functools
import types

import chex
import hybrid_helper as hh
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hybridjax import optim, registry
from hybridjax.hybrid import real_step as real_step_lib
from hybridjax.hybrid import step as step_lib
from hybridjax.hybrid.phases import BRANCH_NAMES, Branch, Exit, Phase
from hybridjax.methods import velocity as velocity_method
from hybridjax.methods.velocity import correct as correct_lib
from hybridjax.methods.velocity import predict as predict_lib


def _assert_legal_sequence(phases):
  allowed = {(0, 0), (0, 1), (1, 1), (1, 2), (2, 2), (2, 3), (3, 3), (3, 1), (3, 2)}
  for a, b in zip(phases, phases[1:]):
    assert (a, b) in allowed, (a, b)


def test_branches_are_the_three_transitions():
  # The velocity predictor's transitions, indexed by `Branch`: its real step, then the two its
  # branches are named after.
  method = registry.load_method("velocity")
  assert method.predict_step.__name__ == BRANCH_NAMES[1] and method.full_step is velocity_method.full_step
  # The CORRECT entry: the rollback, then the same real step (so the fused step compiles it once).
  assert method.correct_step is velocity_method.correct_step and BRANCH_NAMES[2] == "correct_step"
  assert method.correct_step.then is method.full_step
  # A method that defines only its real step takes it in every branch; one that defines none, the baseline's.
  ctx = types.SimpleNamespace(method=registry.load_method("selective_backprop"))
  assert step_lib.transitions(ctx) == (ctx.method.full_step,) * 3
  ctx = types.SimpleNamespace(method=registry.load_method("outer_momentum"))
  assert step_lib.transitions(ctx) == (real_step_lib.baseline_step,) * 3
  assert [int(b) for b in Branch] == list(range(len(BRANCH_NAMES)))


def _real_steps_and_baseline_steps(exact: bool):
  # Before its first PREDICT phase a hybrid run takes only real steps (WARMUP, FULL): each is the
  # baseline's optimizer step, with the trajectory bookkeeping beside it. (With prediction off for
  # a whole run, through `train`: tests/loop/test_train.py.)
  s = hh.setup()
  n = s.ctx.control.warmup_steps + s.ctx.control.full_steps
  state, trace = s.run(n)
  base_step = jax.jit(functools.partial(optim.train_step, loss_fn=hh.loss_fn, tx=hh.TX), donate_argnums=0)
  base = optim.init_train_state(jax.tree.map(jnp.asarray, hh.host_params()), hh.TX)
  losses = []
  for i in range(n):
    base, m = base_step(base, hh.batch(i), hh.SCHEDULE)
    losses.append(m["loss"])
  assert [int(m["phase"]) for m in trace] == [Phase.WARMUP] * s.ctx.control.warmup_steps + [Phase.FULL] * (
    n - s.ctx.control.warmup_steps
  )
  assert int(state.train.step) == int(base.step) == n
  # One comparison for the state and the losses: bit for bit, or up to float32 rounding.
  same = chex.assert_trees_all_equal if exact else functools.partial(chex.assert_trees_all_close, rtol=1e-5, atol=1e-7)
  same(state.train.params, base.params)
  same(state.train.opt_state, base.opt_state)
  same([m["loss"] for m in trace], list(jax.device_get(losses)))


def test_real_steps_are_baseline_steps():
  # In this process (the suite's older fusion emitters, tests/conftest.py) the two different programs
  # may round a reduction differently: equal up to float32 rounding. Bit for bit: the test below.
  _real_steps_and_baseline_steps(exact=False)


@pytest.mark.slow
@pytest.mark.cross_program
def test_real_steps_equal_baseline_steps_bit_exactly():
  _real_steps_and_baseline_steps(exact=True)


def _state_in_predict(s, warm_steps=30, seed=0):
  """A state after `warm_steps` real steps, switched to PREDICT with a known plan."""
  state, _ = s.run(warm_steps, state=s.init_state(seed))
  ctx = s.ctx
  g = ctx.groups.n_groups
  alpha = jnp.linspace(0.5, 1.5, ctx.control.max_predict_steps * g).reshape(ctx.control.max_predict_steps, g)
  c = state.controller.replace(
    phase=jnp.int32(Phase.PREDICT),
    steps_in_phase=jnp.int32(0),
    horizon=jnp.int32(ctx.control.max_predict_steps),
    next_branch=jnp.int32(Branch.PREDICT_STEP),
  )
  plan = state.method.plan.replace(plan_offset=jnp.int32(0), plan_alpha=alpha, alpha_since_good=jnp.zeros((g,)))
  return hh.commit(state.replace(controller=c, method=state.method.replace(plan=plan))), alpha


def test_predicted_step_moves_every_parameter_by_alpha_velocity():
  s = hh.setup()
  state, alpha = _state_in_predict(s)
  before = jax.device_get(state.train.params)
  velocity = jax.device_get(state.method.velocity)
  opt_before = jax.device_get(state.train.opt_state)
  new, info = s.predict(state, hh.batch(100), hh.SCHEDULE)
  after = jax.device_get(new.train.params)
  for gi, (p0, p1, v) in enumerate(zip(jax.tree.leaves(before), jax.tree.leaves(after), jax.tree.leaves(velocity))):
    assert np.all(p1 != p0), f"leaf {s.ctx.groups.names[gi]} did not move in a predicted step"
    a = np.float32(alpha[0, gi])
    chex.assert_trees_all_close(p1, p0 + a * v, rtol=1e-6, atol=1e-9)
    # The displacement is alpha * velocity up to the rounding of p0 (float32 eps * |p0|).
    chex.assert_trees_all_close(p1 - p0, a * v, rtol=1e-5, atol=2e-7 * float(np.abs(p0).max()))
  chex.assert_trees_all_equal(new.train.opt_state, opt_before)  # the optimizer is not touched
  assert int(new.train.step) == int(state.train.step) + 1  # but the schedule's clock moves on
  assert not bool(info.was_real) and float(info.grad_norm) == 0.0
  np.testing.assert_allclose(info.alpha, alpha[0])


def _kept_predicted_steps_and_bare_ones(exact: bool):
  """The fused step runs the method's `predict_step` behind the framework's non-finite guard
  (`step.discard_nonfinite`); a step it keeps must be the method's own step: the same state and
  facts as `predict_step` alone, over predicted steps that validate and train the corrector."""
  s = hh.setup()
  guarded = jax.jit(lambda st, b: step_lib.transitions(s.ctx)[Branch.PREDICT_STEP](s.ctx, st, b, hh.SCHEDULE))
  same = chex.assert_trees_all_equal if exact else functools.partial(chex.assert_trees_all_close, rtol=1e-5, atol=1e-7)
  validated = 0
  warm_starts = (20, 30, 40) if exact else (30,)
  for warm in warm_starts:
    state, _ = _state_in_predict(s, warm_steps=warm)
    for k in range(s.ctx.control.max_predict_steps):
      kept, kept_info = guarded(state, hh.batch(300 + k))
      bare, bare_info = s.predict(state, hh.batch(300 + k), hh.SCHEDULE)
      assert not bool(kept_info.discarded)
      same(kept, bare)
      same(kept_info, bare_info)
      validated += int(bare_info.validated)
      state = bare.replace(controller=bare.controller.replace(steps_in_phase=bare.controller.steps_in_phase + 1))
  assert validated >= 2 * len(warm_starts)  # the corrector trained at each validation


def test_a_kept_predicted_step_is_the_methods_own_step():
  # In this process (the suite's older fusion emitters) up to float32 rounding; bit for bit below.
  _kept_predicted_steps_and_bare_ones(exact=False)


@pytest.mark.slow
@pytest.mark.cross_program
def test_a_kept_predicted_step_is_the_methods_own_step_bit_exactly():
  _kept_predicted_steps_and_bare_ones(exact=True)


def test_unvalidated_predicted_step_reports_no_loss_but_a_predicted_loss():
  s = hh.setup()
  state, _ = _state_in_predict(s)
  assert s.ctx.settings.validate_every == 2
  # k = 0: not a validation step (validate_every 2, horizon 4): no forward pass, no measured loss.
  state, branch, m = s.step(state, hh.batch(0))
  m = jax.device_get(m)
  assert branch == Branch.PREDICT_STEP and not m["measured"]
  assert np.isnan(m["loss"]) and np.isfinite(m["predicted_loss"]) and m["predicted_loss"] > 0
  # k = 1 validates: the measured loss is there.
  state, branch, m = s.step(state, hh.batch(1))
  m = jax.device_get(m)
  assert branch == Branch.PREDICT_STEP and m["measured"] and np.isfinite(m["loss"])
  assert int(state.controller.forward_passes) >= 1


def test_rollback_is_exact_without_snapshot():
  s = hh.setup()
  state, alpha = _state_in_predict(s)
  start = jax.device_get(state.train.params)
  n = s.ctx.control.max_predict_steps - 1
  for k in range(n):
    state, _ = s.predict(state, hh.batch(200 + k), hh.SCHEDULE)
    state = state.replace(controller=state.controller.replace(steps_in_phase=state.controller.steps_in_phase + 1))
  moved = jax.device_get(state.train.params)
  for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(start)):
    assert np.all(a != b)
  # The segment is sum_k alpha_k . velocity: subtracting the summed alphas undoes it.
  back = correct_lib.rollback_params(s.ctx, state.train.params, state.method.velocity, jnp.sum(alpha[:n], axis=0))
  chex.assert_trees_all_close(back, start, rtol=1e-5, atol=1e-6)


# Its own loss and params: every hybrid program compiled afresh (11 s at the suite's -O0), so the slow
# set, which CI runs; the default suite keeps the predicted step's move (alpha * velocity) above.
@pytest.mark.slow
def test_predicted_steps_extrapolate_a_linear_trajectory():
  # Loss linear in the params: SGD takes the same update every step, so the trajectory is a line
  # and alpha = 1 along the velocity must land where the real steps land.
  c = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
  params = {"w": np.zeros((3, 4), np.float32), "b": np.zeros((4,), np.float32)}
  loss = lambda p, b: (100.0 + jnp.sum(c * p["w"]) + jnp.sum(p["b"]), {})  # noqa: E731
  s = hh.Setup(
    {"velocity.constant_alpha": 1.0, "velocity.beta": 0.5, "max_predict_steps": 8, "enable_predict": False},
    loss=loss,
    params=params,
    tx=optax.sgd(1e-2),
  )
  state, _ = s.run(40, batch_fn=lambda i: {})
  real_state, _ = s.run(48, batch_fn=lambda i: {})
  g = s.ctx.groups.n_groups
  c_ = state.controller.replace(phase=jnp.int32(Phase.PREDICT), steps_in_phase=jnp.int32(0), horizon=jnp.int32(8))
  plan = state.method.plan.replace(plan_offset=jnp.int32(0), plan_alpha=jnp.ones((8, g)))
  state = hh.commit(state.replace(controller=c_, method=state.method.replace(plan=plan)))
  for _ in range(8):
    state, _ = s.predict(state, {}, hh.SCHEDULE)
    state = state.replace(controller=state.controller.replace(steps_in_phase=state.controller.steps_in_phase + 1))
  chex.assert_trees_all_close(state.train.params, real_state.train.params, rtol=1e-4, atol=1e-6)


def _finite(tree) -> bool:
  return all(np.all(np.isfinite(x)) for x in jax.tree.leaves(jax.device_get(tree)))


def test_nan_loss_in_every_branch():
  # A NaN loss lands once on each step kind: a full step (FULL), a predicted step that validates, a
  # predicted step that does not, and the CORRECT entry. What happens is checked for each.
  s = hh.setup()
  ctx = s.ctx
  cooldown = ctx.control.cooldown_steps
  state = s.init_state(seed=3)
  pending = ["full", "predict_validated", "predict_unvalidated", "correct"]
  landed = {}
  last = -100
  for i in range(400):
    if not pending:
      break
    c, plan = jax.device_get((state.controller, state.method.plan))
    branch, phase = int(c.next_branch), int(c.phase)
    k = min(max(int(c.steps_in_phase) - int(plan.plan_offset), 0), ctx.control.max_predict_steps - 1)
    validates = (k + 1) % ctx.settings.validate_every == 0 or int(c.steps_in_phase) + 1 >= int(c.horizon)
    kind = {
      Branch.FULL_STEP: "full" if phase == Phase.FULL else None,
      Branch.PREDICT_STEP: "predict_validated" if validates else "predict_unvalidated",
      Branch.CORRECT_STEP: "correct",
    }[branch]
    if kind not in pending or i - last < 3:
      state, _, _ = s.step(state, hh.batch(i))
      continue
    before = jax.device_get(state)
    state, ran, m = s.step(state, hh.batch(i, np.nan))
    m, after = jax.device_get((m, state))
    assert ran == branch
    what = f"NaN in {kind} at step {i}"
    events = after.controller.events - before.controller.events
    assert _finite(after.train.params) and _finite(after.method.velocity), what
    assert int(after.train.step) == int(before.train.step) + 1, what
    if kind in ("full", "correct"):  # a real step: the update is skipped, and counted
      assert np.isnan(m["loss"]) and m["measured"], what
      assert events.tolist() == [1, 0, 0, 0], (what, events)
      assert int(after.controller.cooldown) == cooldown, what
      assert int(after.controller.phase) == Phase.FULL, what
      assert int(after.train.nonfinite_streak) == int(before.train.nonfinite_streak) + 1, what
      chex.assert_trees_all_equal(after.train.opt_state, before.train.opt_state)
      chex.assert_trees_all_equal(after.method.history, before.method.history)  # nothing recorded
      chex.assert_trees_all_equal(after.method.dynamics, before.method.dynamics)  # no training on it
      if kind == "full":
        chex.assert_trees_all_equal(after.train.params, before.train.params)
      else:  # the CORRECT entry still rolls back what diverged (if anything), then skips its update
        want = correct_lib.rollback_params(
          ctx, before.train.params, before.method.velocity, before.method.plan.rollback_alpha
        )
        chex.assert_trees_all_close(after.train.params, want, rtol=1e-6, atol=1e-7)
        assert not np.any(after.method.plan.rollback_alpha), what
    elif kind == "predict_validated":  # the measurement is non-finite: the segment ends
      assert np.isnan(m["loss"]) and m["measured"] and m["diverged"], what
      assert events.tolist() == [1, 0, 0, 0], (what, events)
      assert int(after.controller.phase) == Phase.CORRECT, what
      assert int(after.controller.last_exit) == Exit.NONFINITE, what
      assert int(after.controller.next_branch) == Branch.CORRECT_STEP, what
      np.testing.assert_allclose(
        after.method.plan.rollback_alpha, before.method.plan.alpha_since_good + m["alpha"], rtol=1e-6
      )
    else:  # not validated: the loss is never computed, so the NaN goes unseen
      assert np.isnan(m["loss"]) and not m["measured"] and not m["diverged"], what
      assert events.tolist() == [0, 0, 0, 0], (what, events)
      assert int(after.controller.phase) in (Phase.PREDICT, Phase.CORRECT), what
      assert int(after.train.nonfinite_streak) == int(before.train.nonfinite_streak), what
    pending.remove(kind)
    landed[kind] = i
    last = i
  assert not pending, f"never injected: {pending}; landed: {landed}"
  # And training goes on: after the cooldown the run predicts again.
  state, trace = s.run(60, state=state, start=1000)
  assert _finite(state.train.params)
  assert Phase.PREDICT in {int(m["phase"]) for m in trace}


def test_hybrid_moves_through_all_phases_and_horizon_is_bounded():
  s = hh.setup()
  state, trace = s.run(150)
  phases = [int(m["phase"]) for m in trace]
  assert set(phases) == {0, 1, 2, 3}, phases
  _assert_legal_sequence(phases)
  assert max(int(m["horizon"]) for m in trace) <= 4
  assert [int(m["step"]) for m in trace] == list(range(1, 151))
  c = state.controller
  assert int(c.phase_steps.sum()) == 150
  # Micro-corrections: every `correction_interval` predicted steps one real step (with a gradient)
  # runs inside the PREDICT phase.
  micro = [m for m in trace if int(m["phase"]) == Phase.PREDICT and float(m["grad_norm"]) > 0]
  assert micro, "no micro-correction happened"
  assert int(c.backward_passes) == 150 - int(c.phase_steps[Phase.PREDICT]) + len(micro)
  # Measured losses: every real step, and the validated predicted steps.
  measured = [m for m in trace if m["measured"]]
  assert int(c.forward_passes) == len(measured) - int(c.backward_passes)
  assert all(np.isfinite(m["loss"]) for m in measured)
  assert all(np.isnan(m["loss"]) for m in trace if not m["measured"])


@pytest.fixture(scope="module")
def host_run():
  """48 steps with host dispatch: the reference both fused dispatches are held to."""
  s = hh.setup()
  return s, *s.run(48, dispatch="host")


def _assert_same_run(name, run, trace, host, th):
  phases = [int(m["phase"]) for m in th]
  assert {0, 1, 2, 3} <= set(phases), phases
  assert [int(m["phase"]) for m in trace] == phases, name
  assert [bool(m["measured"]) for m in trace] == [bool(m["measured"]) for m in th], name
  # Bit for bit: each branch is one program either way, its fusion fixed by optimization barriers.
  chex.assert_trees_all_equal(run.train, host.train)
  chex.assert_trees_all_equal(run.controller, host.controller)
  np.testing.assert_array_equal([m["loss"] for m in trace], [m["loss"] for m in th])


def test_fused_switch_equals_host_dispatch(host_run):
  s, host, th = host_run
  fused, tf = s.run(48, dispatch="switch")
  _assert_same_run("switch", fused, tf, host, th)


@pytest.mark.slow  # a third program to compile (K steps per call); CI runs it, and tests/loop/test_drivers.py
def test_fused_scan_equals_host_dispatch(host_run):
  s, host, th = host_run
  state = s.init_state()
  ts = []
  k = 4  # as tests/loop/test_drivers.py's K=4 run: the same program
  for start in range(0, 48, k):
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *[hh.batch(i) for i in range(start, start + k)])
    state, m = s.multi(state, stacked, hh.SCHEDULE)
    chex.assert_shape(m["loss"], (k,))
    m = jax.device_get(m)
    ts += [{key: v[j] for key, v in m.items()} for j in range(k)]
  _assert_same_run("scan", state, ts, host, th)


class StepVariantsTest(chex.TestCase):
  """Jit and no-jit agree. The real step is compared jitted only: run op by op, its RSSM training
  scan alone takes minutes, and it is covered by the fused-vs-host test above."""

  @chex.variants(with_jit=True, without_jit=True)
  @pytest.mark.slow  # op by op, the predicted step's corrector update alone takes seconds
  def test_predict_step_jit_and_nojit_agree(self):
    s = hh.setup()
    pred_state, _ = _state_in_predict(s, warm_steps=12)
    pred = self.variant(lambda st, b: predict_lib.predict_step(s.ctx, st, b, hh.SCHEDULE))
    a, ia = pred(pred_state, hh.batch(50))
    b, ib = s.predict(pred_state, hh.batch(50), hh.SCHEDULE)
    chex.assert_trees_all_close(a.train.params, b.train.params, rtol=1e-6)
    chex.assert_trees_all_close(ia, ib, rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rollback_jit_and_nojit_agree(self):
    s = hh.setup()
    g = s.ctx.groups.n_groups
    params = jax.tree.map(jnp.asarray, s.params)
    vel = jax.tree.map(jnp.ones_like, params)
    alpha = jnp.arange(g, dtype=jnp.float32)
    back = self.variant(lambda p, v, a: correct_lib.rollback_params(s.ctx, p, v, a))(params, vel, alpha)
    ref = jax.tree.map(
      lambda p, gi: p - gi,
      params,
      jax.tree.unflatten(s.ctx.groups.treedef, [jnp.float32(gi) for gi in s.ctx.groups.leaf_group]),
    )
    chex.assert_trees_all_close(back, ref, rtol=1e-6)
