"""`correct_step`: the first step of a CORRECT phase (docs/design.md, "Rollback").

It rolls back the part of the PREDICT segment that diverged, exactly and without a snapshot: every
predicted step moved the params by alpha . velocity with the velocity fixed during the phase, so

  theta <- theta - sum_g A_g * velocity_g,   A = the alphas summed since the last good validation.

Then it trains the residual corrector on what the phase's validations observed, and takes a
`full_step`. The rest of CORRECT is ordinary real steps.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid.context import HybridContext
from hybridjax.hybrid.state import HybridState
from hybridjax.hybrid.step import Prepared
from hybridjax.methods.velocity import corrector as corrector_lib
from hybridjax.methods.velocity.plan import VelocityState
from hybridjax.methods.velocity.real import full_step
from hybridjax.optim import Batch, Schedule


def rollback_params(ctx: HybridContext, params: Any, velocity: Any, alpha_sum: jax.Array) -> Any:
  """theta - sum_g A_g velocity_g: undoes predicted steps whose alphas sum to `alpha_sum`, exactly
  up to float rounding, with no snapshot of the params."""
  return groups_lib.add_scaled_by_group(ctx.groups, params, -alpha_sum, velocity)


def roll_back(ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule) -> HybridState:
  """The CORRECT entry before its full step: roll back what diverged and train the corrector."""
  del batch, schedule  # the full step that follows reads them
  m: VelocityState = state.method
  params = rollback_params(ctx, state.train.params, m.velocity, m.plan.rollback_alpha)
  corr = m.corrector
  if ctx.settings.corrector_enabled:
    corr, _ = corrector_lib.train_corrector(
      corr, ctx.settings.corrector_hidden, ctx.settings.corrector_lr, jnp.any(corr.valid)
    )
  return state.replace(
    train=state.train.replace(params=params),
    method=m.replace(corrector=corr, plan=m.plan.replace(rollback_alpha=jnp.zeros_like(m.plan.rollback_alpha))),
  )


correct_step = Prepared(roll_back, full_step)
"""First CORRECT step: roll back what diverged, train the corrector, then a full step. A `Prepared`
transition, so that the fused step compiles `full_step` once for FULL and CORRECT."""
