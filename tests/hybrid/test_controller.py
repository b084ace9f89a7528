"""The controller (hybridjax.hybrid.controller): legal transitions, the horizon, accuracy and
agreement, the next branch, and the confidence gate deciding inside real hybrid steps."""

from __future__ import annotations

import dataclasses

import chex
import hybrid_helper as hh
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid import state as state_lib
from hybridjax.hybrid.context import ControllerSettings, make_step_info
from hybridjax.hybrid.phases import Branch, Exit, Phase
from hybridjax.methods import velocity as velocity_method
from hybridjax.methods.velocity import real as real_step_lib
from hybridjax.methods.velocity.plan import VelocityState, init_plan

SETTINGS = ControllerSettings(
  enable_predict=True,
  warmup_steps=3,
  full_steps=2,
  max_predict_steps=5,
  confidence_threshold=0.4,
  correct_steps=2,
  correction_interval=0,
  grad_explosion_factor=10.0,
  loss_spike_sigma=6.0,
  max_prediction_failures=2,
  cooldown_steps=4,
)
G = 2


def _ctrl():
  return state_lib.init_controller()


def _plan():
  return init_plan(max_predict_steps=5, n_groups=G, feature_dim=3, accuracy_window=4)


def _info(
  *,
  was_real=True,
  finite=True,
  explosion=False,
  spike=False,
  validated=False,
  diverged=False,
  nonfinite_prediction=False,
  rollback_alpha=None,
):
  return make_step_info(
    loss=1.0,
    predicted_loss=1.0,
    grad_norm=1.0 if was_real else 0.0,
    was_real=was_real,
    finite=finite,
    explosion=explosion,
    spike=spike,
    validated=validated,
    diverged=diverged,
    nonfinite_prediction=nonfinite_prediction,
    rolled_back=rollback_alpha is not None and bool(jnp.any(rollback_alpha != 0)),
    alpha=jnp.zeros((G,)),
    extra=jnp.zeros((G,)) if rollback_alpha is None else rollback_alpha,
  )


_transition = jax.jit(controller_lib.transition, static_argnums=2)


def _legal(phases):
  allowed = {(0, 0), (0, 1), (1, 1), (1, 2), (2, 2), (2, 3), (3, 3), (3, 1), (3, 2)}
  return all((a, b) in allowed for a, b in zip(phases, phases[1:]))


step_info = st.fixed_dictionaries(
  {
    "confidence": st.floats(0.0, 1.0),
    "finite": st.booleans(),
    "explosion": st.booleans(),
    "spike": st.booleans(),
    "validated": st.booleans(),
    "diverged": st.booleans(),
    "nonfinite_prediction": st.booleans(),
  }
)


@settings(max_examples=30, deadline=None)
@given(st.lists(step_info, min_size=1, max_size=40))
def test_controller_transitions_are_legal(infos):
  ctrl = _ctrl()
  phases = [0]
  for info in infos:
    in_predict = int(ctrl.phase) == Phase.PREDICT
    was_real = not in_predict
    cooldown_before = int(ctrl.cooldown)
    ctrl = ctrl.replace(confidence=jnp.float32(info["confidence"]))
    validated = info["validated"] and in_predict
    ctrl = _transition(
      ctrl,
      _info(
        was_real=was_real,
        finite=info["finite"] or not was_real,
        explosion=info["explosion"] and was_real,
        spike=info["spike"] and was_real,
        validated=validated,
        diverged=info["diverged"] and validated,
        nonfinite_prediction=info["nonfinite_prediction"] and validated,
      ),
      SETTINGS,
    )
    phases.append(int(ctrl.phase))
    assert 1 <= int(ctrl.horizon) <= 5
    if phases[-1] == Phase.PREDICT and phases[-2] != Phase.PREDICT:  # the gate let it in
      assert int(ctrl.cooldown) == 0 and info["confidence"] >= SETTINGS.confidence_threshold
      assert max(cooldown_before - 1, 0) == 0
    if was_real and not info["finite"]:  # a non-finite real step never leads into PREDICT
      assert int(ctrl.phase) != Phase.PREDICT and int(ctrl.cooldown) == SETTINGS.cooldown_steps
    want = controller_lib.next_branch(ctrl.phase, ctrl.steps_in_phase, SETTINGS)
    assert int(ctrl.next_branch) == int(want)
  assert _legal(phases), phases
  assert int(ctrl.phase_steps.sum()) == len(infos)


def test_transition_table_by_hand():
  c = _ctrl().replace(confidence=jnp.float32(0.9))
  for _ in range(SETTINGS.warmup_steps):
    assert int(c.phase) == Phase.WARMUP
    c = _transition(c, _info(), SETTINGS)
  assert int(c.phase) == Phase.FULL and int(c.steps_in_phase) == 0
  for _ in range(SETTINGS.full_steps):
    c = _transition(c, _info(), SETTINGS)
  # Confident enough after full_steps: PREDICT, with the horizon the confidence earns.
  assert int(c.phase) == Phase.PREDICT and int(c.next_branch) == Branch.PREDICT_STEP
  assert int(c.horizon) == int(controller_lib.horizon_for(jnp.float32(0.9), SETTINGS)) == 5
  assert int(c.predict_phases) == 1 and int(c.last_exit) == Exit.NONE
  # A diverged validation ends it: CORRECT, whose first step is the CORRECT entry (rollback).
  alpha = jnp.asarray([0.5, 0.25])
  before, info = c, _info(was_real=False, validated=True, diverged=True, rollback_alpha=alpha)
  c = _transition(c, info, SETTINGS)
  assert int(c.phase) == Phase.CORRECT and int(c.next_branch) == Branch.CORRECT_STEP
  assert int(c.last_exit) == Exit.DIVERGED and int(c.rollbacks) == 1
  # The velocity predictor keeps the segment's alphas for its CORRECT entry to subtract.
  vstate = VelocityState(velocity=None, dynamics=None, corrector=None, history=None, plan=_plan())
  np.testing.assert_array_equal(velocity_method.on_transition(None, vstate, before, c, info).plan.rollback_alpha, alpha)
  assert int(c.consecutive_failures) == 1
  c = _transition(c, _info(), SETTINGS)
  assert int(c.next_branch) == Branch.FULL_STEP
  # After correct_steps, a low confidence goes to FULL instead of PREDICT.
  c = _transition(c.replace(confidence=jnp.float32(0.1)), _info(), SETTINGS)
  assert int(c.phase) == Phase.FULL
  # A health event in FULL starts the cooldown, which blocks PREDICT until it has run out.
  c = _transition(c.replace(confidence=jnp.float32(0.9)), _info(finite=False), SETTINGS)
  assert int(c.cooldown) == SETTINGS.cooldown_steps and int(c.events[0]) == 1
  phases = []
  for _ in range(SETTINGS.cooldown_steps + 1):
    c = _transition(c, _info(), SETTINGS)
    phases.append(int(c.phase))
  assert phases[: SETTINGS.cooldown_steps - 1] == [Phase.FULL] * (SETTINGS.cooldown_steps - 1)
  assert phases[-1] == Phase.PREDICT


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 0.99), st.integers(1, 50))
def test_horizon_grows_with_confidence_and_is_bounded(conf, thr, hmax):
  s = dataclasses.replace(SETTINGS, confidence_threshold=thr, max_predict_steps=hmax)
  h = int(controller_lib.horizon_for(jnp.float32(conf), s))
  assert 1 <= h <= hmax
  h_hi = int(controller_lib.horizon_for(jnp.float32(min(conf + 0.1, 1.0)), s))
  assert h_hi >= h
  assert int(controller_lib.horizon_for(jnp.float32(1.0), s)) == hmax


def test_accuracy_and_agreement():
  c = _plan()
  assert float(controller_lib.accuracy(c, 0.05)) == 0.0  # no evidence: no confidence
  c = controller_lib.push_error(c, jnp.float32(0.0), jnp.bool_(True))
  assert float(controller_lib.accuracy(c, 0.05)) == 1.0
  c = controller_lib.push_error(c, jnp.float32(0.1), jnp.bool_(True))  # mean error 0.05 = tol
  np.testing.assert_allclose(float(controller_lib.accuracy(c, 0.05)), 0.5, rtol=1e-6)
  c2 = controller_lib.push_error(c, jnp.float32(np.nan), jnp.bool_(True))  # not recorded
  c2 = controller_lib.push_error(c2, jnp.float32(9.0), jnp.bool_(False))  # not enabled
  chex.assert_trees_all_equal(c2, c)
  # The error ring wraps after accuracy_window entries.
  for e in (0.2, 0.2, 0.2):
    c = controller_lib.push_error(c, jnp.float32(e), jnp.bool_(True))
  assert int(c.errors_pos) == 1 and float(c.errors[0]) == pytest.approx(0.2)
  np.testing.assert_allclose(float(controller_lib.relative_error(jnp.log(1.1), 0.0)), 0.1, rtol=1e-5)
  same = jnp.ones((3, 4))
  assert float(real_step_lib.agreement(same, 0.05)) == 1.0
  spread = jnp.stack([jnp.zeros(4), jnp.full(4, 0.1)])
  assert 0.0 < float(real_step_lib.agreement(spread, 0.05)) < float(real_step_lib.agreement(spread / 10, 0.05)) < 1.0


def test_next_branch_schedules_micro_corrections():
  s = dataclasses.replace(SETTINGS, correction_interval=2)
  branches = [int(controller_lib.next_branch(jnp.int32(Phase.PREDICT), jnp.int32(k), s)) for k in range(6)]
  # `steps_in_phase` steps taken: after every 2 predicted steps, one real step.
  assert branches == [
    Branch.PREDICT_STEP,
    Branch.PREDICT_STEP,
    Branch.FULL_STEP,
    Branch.PREDICT_STEP,
    Branch.PREDICT_STEP,
    Branch.FULL_STEP,
  ]
  assert int(controller_lib.next_branch(jnp.int32(Phase.CORRECT), jnp.int32(0), s)) == Branch.CORRECT_STEP
  assert int(controller_lib.next_branch(jnp.int32(Phase.CORRECT), jnp.int32(1), s)) == Branch.FULL_STEP
  assert int(controller_lib.next_branch(jnp.int32(Phase.FULL), jnp.int32(7), s)) == Branch.FULL_STEP


class TransitionVariantsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_transition_jit_and_nojit_agree(self):
    c = _ctrl().replace(confidence=jnp.float32(0.7))
    t = self.variant(lambda c, i: controller_lib.transition(c, i, SETTINGS))
    for info in (_info(), _info(finite=False), _info(explosion=True)):
      chex.assert_trees_all_equal(t(c, info), _transition(c, info, SETTINGS))
      c = _transition(c, info, SETTINGS)


# --- the confidence gate inside real hybrid steps -------------------------------------------------


@pytest.mark.slow
def test_confidence_gate_decides_when_to_predict():
  # The MLP's confidences range over roughly 0.3-0.85 (0.55-0.8 in the first FULL phase); at 0.8
  # the gate must refuse some eligible steps and admit others. (The context also has the corrector
  # off: `hh.GATED` serves tests/methods/test_corrector.py too.)
  s = hh.setup(**hh.GATED)
  threshold = s.ctx.control.confidence_threshold
  assert threshold == 0.8
  state, trace = s.run(150)
  ctx = s.ctx
  assert int(state.controller.events.sum()) == 0  # no health event, no cooldown: the gate decides
  phases = [int(m["phase"]) for m in trace]
  conf = [float(m["confidence"]) for m in trace]
  entered, refused, ended = [], [], []
  k = 0  # steps taken in the current phase, this one included
  for i in range(len(trace) - 1):
    k = k + 1 if i and phases[i] == phases[i - 1] else 1
    eligible = (phases[i] == Phase.FULL and k >= ctx.control.full_steps) or (
      phases[i] == Phase.CORRECT and k >= ctx.control.correct_steps
    )
    if phases[i + 1] == Phase.PREDICT and phases[i] != Phase.PREDICT:
      # The confidence this step earned opened the gate...
      assert eligible and conf[i] >= threshold, (i, k, conf[i])
      entered.append(i)
    elif eligible:
      # ...and an eligible step that did not enter PREDICT was below it.
      assert conf[i] < threshold, (i, k, conf[i])
      refused.append(i)
      if phases[i] == Phase.CORRECT:
        assert phases[i + 1] == Phase.FULL
        ended.append(i)
  assert len(entered) >= 2 and len(refused) >= 20 and ended, (entered, refused, ended)
  # The horizon of each PREDICT phase is the one its entry's confidence earned.
  for i in entered:
    want = int(controller_lib.horizon_for(jnp.float32(conf[i]), ctx.control))
    assert int(trace[i + 1]["horizon"]) == want
    assert 1 <= want <= ctx.control.max_predict_steps
  assert int(state.controller.predict_phases) == len(entered) + (
    phases[-1] == Phase.PREDICT and phases[-2] != Phase.PREDICT
  )


# Slow: a hybrid step compiled for its own threshold (12 s); the gate itself is
# test_confidence_gate_decides_when_to_predict.
@pytest.mark.slow
def test_confidence_threshold_one_never_predicts():
  state, trace = hh.setup(confidence_threshold=1.0).run(60)
  assert {int(m["phase"]) for m in trace} == {Phase.WARMUP, Phase.FULL}
  assert 0.5 < max(float(m["confidence"]) for m in trace) < 1.0
  c = state.controller
  assert int(c.phase_steps[Phase.PREDICT]) == 0 and int(c.predict_phases) == 0
  assert int(c.backward_passes) == 60
