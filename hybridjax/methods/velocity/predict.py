"""`predict_step`: a predicted step, no backward pass (docs/design.md, "Steps").

Every parameter moves along its group's velocity by the planned alpha,

  theta <- theta + sum_g alpha_{g,k} * velocity_g,

with a forward-pass validation every `validate_every` steps and at the horizon. A validation that
exceeds the plan (or the phase's starting loss) by the divergence tolerance ends the phase, and the
segment since the last good validation is rolled back at the CORRECT entry (`correct_step`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.state import HybridState
from hybridjax.methods.velocity import corrector as corrector_lib
from hybridjax.methods.velocity.plan import VelocityState
from hybridjax.optim import Batch, Schedule, moved_train_state


def predict_step(
  ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule
) -> tuple[HybridState, StepInfo]:
  """A predicted step: every parameter moves by alpha_{g,k} * velocity_g; no backward pass.

  `schedule` is unused (a predicted step makes no optimizer update); it is taken so that all three
  transitions share one signature for the fused step.
  """
  del schedule
  tr, c, groups = state.train, state.controller, ctx.groups
  m: VelocityState = state.method
  p = m.plan
  k = jnp.clip(c.steps_in_phase - p.plan_offset, 0, ctx.control.max_predict_steps - 1)
  alpha = p.plan_alpha[k]
  # A non-finite plan (a diverged dynamics model) never moves the params: it ends the phase as a
  # non-finite prediction instead, and the segment so far is rolled back.
  bad_plan = ~jnp.all(jnp.isfinite(alpha))
  alpha = jnp.where(bad_plan, 0.0, alpha)
  params = groups_lib.add_scaled_by_group(groups, tr.params, alpha, m.velocity)
  since_good = p.alpha_since_good + alpha

  validate = (((k + 1) % ctx.settings.validate_every) == 0) | (c.steps_in_phase + 1 >= c.horizon)
  loss = jax.lax.cond(
    validate, lambda p: ctx.loss_fn(p, batch)[0].astype(jnp.float32), lambda p: jnp.ones((), jnp.float32), params
  )
  logloss = groups_lib.safe_log(loss)
  predicted = p.plan_logloss[k]
  finite = jnp.isfinite(logloss)
  tol = jnp.log1p(ctx.settings.divergence_tolerance)
  nonfinite_prediction = (validate & ~finite) | bad_plan
  diverged = validate & finite & ~bad_plan & ((logloss > predicted + tol) | (logloss > c.start_logloss + tol))
  good = validate & finite & ~diverged & ~bad_plan
  rollback = jnp.where(diverged | nonfinite_prediction, since_good, 0.0)
  p = controller_lib.push_error(p, controller_lib.relative_error(logloss, predicted), validate & finite)

  corr = m.corrector
  if ctx.settings.corrector_enabled:
    # The corrector learns from every validation: the residual of the dynamics model's log-loss and
    # the alpha scale that would have matched the realised improvement.
    observed = validate & finite
    realised_gain = c.start_logloss - logloss
    predicted_gain = c.start_logloss - predicted
    target_log_scale = p.plan_log_scale[k] + jnp.clip(
      jnp.log(jnp.maximum(realised_gain, 1e-3) / jnp.maximum(predicted_gain, 1e-3)), -1.5, 0.5
    )
    corr = corrector_lib.add_residual(
      corr,
      p.plan_x,
      (k + 1).astype(jnp.float32) / ctx.control.max_predict_steps,
      logloss - p.plan_raw_logloss[k],
      target_log_scale,
      observed,
    )
    corr, _ = corrector_lib.train_corrector(corr, ctx.settings.corrector_hidden, ctx.settings.corrector_lr, observed)

  acc = controller_lib.accuracy(p, ctx.settings.divergence_tolerance)
  p = p.replace(alpha_since_good=jnp.where(good, 0.0, since_good), accuracy=acc)
  c = c.replace(confidence=p.agreement * acc)
  new_state = state.replace(train=moved_train_state(tr, params), method=m.replace(corrector=corr, plan=p), controller=c)
  info = StepInfo.predicted(
    # Only a validated step has a measured loss; the plan's value is `predicted_loss`.
    loss=jnp.where(validate, loss, jnp.nan),
    predicted_loss=jnp.exp(predicted),
    validated=validate,
    diverged=diverged,
    nonfinite_prediction=nonfinite_prediction,
    rolled_back=jnp.any(rollback != 0),
    alpha=alpha,
    extra=rollback,
  )
  return new_state, info
