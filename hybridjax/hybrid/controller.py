"""The controller: confidence, horizon, health monitor and phase transitions, as pure jnp functions.

Transition table (k = steps taken in the current phase, after this step):

  WARMUP   k >= warmup_steps                                   -> FULL
  FULL     k >= full_steps and eligible                        -> PREDICT
  PREDICT  diverged, non-finite loss, a discarded step         -> CORRECT (rolls back on entry)
           (non-finite params), or k >= horizon
  CORRECT  k >= correct_steps: eligible -> PREDICT, else       -> FULL
  any      health event (non-finite, explosion, spike,         -> FULL (from PREDICT via CORRECT,
           repeated prediction failure)                           so the segment is rolled back)

  eligible = enable_predict and cooldown == 0 and confidence >= confidence_threshold

All of it runs on the device inside the jitted step; nothing here syncs with the host.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hybridjax.hybrid.context import ControllerSettings, StepInfo
from hybridjax.hybrid.phases import Branch, Exit, Phase
from hybridjax.hybrid.state import Controller

# Real steps before the health statistics are trusted (loss spike, gradient explosion).
HEALTH_WARMUP = 20
# The betas of the two log-loss EMAs of real steps (`Controller.ema_fast`, `ema_slow`).
LOSS_BETA_FAST = 0.7
LOSS_BETA_SLOW = 0.97


def entering_predict(before: Controller, after: Controller) -> jax.Array:
  """True when the transition from `before` to `after` started a PREDICT phase."""
  return (after.phase != before.phase) & (after.phase == Phase.PREDICT)


def predict_done(before: Controller, after: Controller) -> jax.Array:
  """True when the transition from `before` to `after` ended a PREDICT phase (it goes to CORRECT)."""
  return (before.phase == Phase.PREDICT) & (after.phase == Phase.CORRECT)


def push_error(ctrl: Any, rel_error: jax.Array, enabled: jax.Array) -> Any:
  """Records one relative prediction error |L / L_hat - 1| when `enabled`, in a ring buffer held by
  `ctrl` (any state with `errors`, `errors_valid`, `errors_pos`: the velocity predictor's plan)."""
  i = ctrl.errors_pos
  n = ctrl.errors.shape[0]
  ok = enabled & jnp.isfinite(rel_error)
  return ctrl.replace(
    errors=jnp.where(ok, ctrl.errors.at[i].set(rel_error), ctrl.errors),
    errors_valid=jnp.where(ok, ctrl.errors_valid.at[i].set(True), ctrl.errors_valid),
    errors_pos=jnp.where(ok, (i + 1) % n, i),
  )


def relative_error(logloss: jax.Array, predicted_logloss: jax.Array) -> jax.Array:
  """|L / L_hat - 1| from log-losses."""
  return jnp.abs(jnp.expm1(logloss - predicted_logloss))


def accuracy(ctrl: Any, tolerance: float) -> jax.Array:
  """Recent realised accuracy in [0, 1]: 1 at zero error, 0 at twice the divergence tolerance."""
  w = ctrl.errors_valid.astype(jnp.float32)
  mean_err = jnp.sum(w * ctrl.errors) / jnp.maximum(jnp.sum(w), 1.0)
  acc = jnp.clip(1.0 - mean_err / (2.0 * tolerance), 0.0, 1.0)
  # No evidence yet: no confidence.
  return jnp.where(jnp.sum(w) > 0, acc, 0.0)


def horizon_for(confidence: jax.Array, s: ControllerSettings) -> jax.Array:
  """H grows linearly from 1 at the threshold to max_predict_steps at confidence 1."""
  frac = (confidence - s.confidence_threshold) / max(1.0 - s.confidence_threshold, 1e-6)
  h = jnp.ceil(jnp.clip(frac, 0.0, 1.0) * s.max_predict_steps)
  return jnp.clip(h, 1, s.max_predict_steps).astype(jnp.int32)


def update_real_stats(
  ctrl: Controller, logloss: jax.Array, grad_norm: jax.Array, finite: jax.Array, s: ControllerSettings
) -> tuple[Controller, jax.Array, jax.Array]:
  """Updates the loss/gradient statistics after a real step and checks them.

  Returns (controller, grad_explosion, loss_spike). Statistics are compared before they absorb this
  step, and a non-finite step leaves them untouched.
  """
  warm = ctrl.real_count >= HEALTH_WARMUP
  explosion = finite & warm & (grad_norm > s.grad_explosion_factor * ctrl.grad_norm_ema)
  spike = finite & warm & (logloss > ctrl.loss_mean + s.loss_spike_sigma * jnp.sqrt(ctrl.loss_var + 1e-8))
  first = ctrl.real_count == 0
  a = 0.05
  mean = jnp.where(first, logloss, (1 - a) * ctrl.loss_mean + a * logloss)
  var = jnp.where(first, 0.0, (1 - a) * (ctrl.loss_var + a * jnp.square(logloss - ctrl.loss_mean)))
  # A spike or explosion does not enter the baselines it was measured against.
  absorb = finite & ~explosion & ~spike

  def ema(old, beta):
    return jnp.where(finite, jnp.where(first, logloss, beta * old + (1 - beta) * logloss), old)

  new = ctrl.replace(
    ema_fast=ema(ctrl.ema_fast, LOSS_BETA_FAST),
    ema_slow=ema(ctrl.ema_slow, LOSS_BETA_SLOW),
    loss_mean=jnp.where(absorb, mean, ctrl.loss_mean),
    loss_var=jnp.where(absorb, var, ctrl.loss_var),
    grad_norm_ema=jnp.where(
      absorb, jnp.where(first, grad_norm, 0.9 * ctrl.grad_norm_ema + 0.1 * grad_norm), ctrl.grad_norm_ema
    ),
    real_count=ctrl.real_count + finite.astype(jnp.int32),
    last_logloss=jnp.where(finite, logloss, ctrl.last_logloss),
  )
  return new, explosion, spike


def next_branch(phase: jax.Array, steps_in_phase: jax.Array, s: ControllerSettings) -> jax.Array:
  """Which step kind runs next: a real step, a predicted step, or the CORRECT entry (rollback)."""
  micro = jnp.asarray(False)
  if s.correction_interval > 0:
    # A micro-correction: one real step every `correction_interval` predict steps.
    micro = (steps_in_phase + 1) % (s.correction_interval + 1) == 0
  branch = jnp.where(phase == Phase.PREDICT, jnp.where(micro, Branch.FULL_STEP, Branch.PREDICT_STEP), Branch.FULL_STEP)
  branch = jnp.where((phase == Phase.CORRECT) & (steps_in_phase == 0), Branch.CORRECT_STEP, branch)
  return branch.astype(jnp.int32)


def transition(ctrl: Controller, info: StepInfo, s: ControllerSettings) -> Controller:
  """Advances phase, counters, cooldown and health after one step.

  Args:
    ctrl: the controller after the step's own bookkeeping (confidence, plan, alpha sums).
    info: what the step observed (`StepInfo`: real or predicted, finite, health checks,
      validation outcome, whether the segment is rolled back).
    s: the static settings.
  """
  was_real, finite = info.was_real, info.finite
  explosion, spike, diverged = info.explosion, info.spike, info.diverged
  nonfinite_prediction = info.nonfinite_prediction
  phase = ctrl.phase
  k = ctrl.steps_in_phase + 1
  in_predict = phase == Phase.PREDICT
  # A non-finite loss is a health event whether a real step or a PREDICT validation measured it.
  nonfinite = (was_real & ~finite) | nonfinite_prediction
  bad_predict = in_predict & (diverged | nonfinite_prediction)
  failures = jnp.where(bad_predict, ctrl.consecutive_failures + 1, ctrl.consecutive_failures)
  prediction_failure = bad_predict & (failures >= s.max_prediction_failures)
  failures = jnp.where(prediction_failure, 0, failures)
  health = nonfinite | explosion | spike | prediction_failure
  events = ctrl.events + jnp.stack([nonfinite, explosion, spike, prediction_failure]).astype(jnp.int32)
  cooldown = jnp.where(health, s.cooldown_steps, jnp.maximum(ctrl.cooldown - 1, 0))

  eligible = s.enable_predict & (cooldown == 0) & (ctrl.confidence >= s.confidence_threshold) & ~health
  # Any health event ends PREDICT (a gradient explosion or loss spike in a micro-correction too), so
  # the phase goes to FULL via CORRECT, as the transition table says.
  predict_done = in_predict & (bad_predict | (k >= ctrl.horizon) | health)
  nxt = phase
  nxt = jnp.where((phase == Phase.WARMUP) & (k >= s.warmup_steps), Phase.FULL, nxt)
  nxt = jnp.where((phase == Phase.FULL) & (k >= s.full_steps) & eligible, Phase.PREDICT, nxt)
  nxt = jnp.where(predict_done, Phase.CORRECT, nxt)
  nxt = jnp.where(
    (phase == Phase.CORRECT) & (k >= s.correct_steps), jnp.where(eligible, Phase.PREDICT, Phase.FULL), nxt
  )
  nxt = jnp.where((phase == Phase.CORRECT) & health, Phase.FULL, nxt)
  nxt = nxt.astype(jnp.int32)
  changed = nxt != phase
  entering_predict = changed & (nxt == Phase.PREDICT)
  steps_in_phase = jnp.where(changed, 0, k).astype(jnp.int32)

  exit_reason = jnp.where(
    nonfinite_prediction | nonfinite, Exit.NONFINITE, jnp.where(diverged, Exit.DIVERGED, Exit.HORIZON)
  )
  # A good segment resets the failure count.
  failures = jnp.where(predict_done & ~bad_predict, 0, failures)
  # A discarded step ends its segment too: the framework undid the step, the method undoes at the
  # CORRECT entry what it had not validated before it.
  rolled = predict_done & (info.rolled_back | info.discarded)
  predicted_nonfinite = ~was_real & nonfinite
  new = ctrl.replace(
    phase=nxt,
    steps_in_phase=steps_in_phase,
    horizon=jnp.where(entering_predict, horizon_for(ctrl.confidence, s), ctrl.horizon),
    start_logloss=jnp.where(entering_predict, ctrl.ema_fast, ctrl.start_logloss),
    last_exit=jnp.where(predict_done, exit_reason, jnp.where(entering_predict, Exit.NONE, ctrl.last_exit)),
    cooldown=cooldown.astype(jnp.int32),
    consecutive_failures=failures.astype(jnp.int32),
    events=events,
    nonfinite_predicted=ctrl.nonfinite_predicted + predicted_nonfinite.astype(jnp.int32),
    discarded=ctrl.discarded + info.discarded.astype(jnp.int32),
    phase_steps=ctrl.phase_steps.at[phase].add(1),
    backward_passes=ctrl.backward_passes + was_real.astype(jnp.int32),
    forward_passes=ctrl.forward_passes + info.forwards,
    batches=ctrl.batches + info.batch_consumed.astype(jnp.int32),
    predict_phases=ctrl.predict_phases + entering_predict.astype(jnp.int32),
    rollbacks=ctrl.rollbacks + rolled.astype(jnp.int32),
    prev_was_real=was_real,
  )
  return new.replace(next_branch=next_branch(nxt, steps_in_phase, s))
