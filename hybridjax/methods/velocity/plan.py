"""The velocity predictor's own state (`HybridState.method` with `hybrid.method='velocity'`).

VelocityState
  velocity    params-shaped trajectory memory: the EMA of real updates
  dynamics    RSSM params + its opt_state + recurrent state
  corrector   residual corrector params + opt_state + its residual buffer
  history     ring buffers of the last real steps: features, log-loss, alpha targets
  plan        the PREDICT phase imagined at the last real step, its confidence terms, the
              alpha sums a rollback subtracts, and the recent prediction errors
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from hybridjax.hybrid.trajectory import History
from hybridjax.methods.velocity import corrector as corrector_lib
from hybridjax.models import rssm as dynamics_lib


@flax.struct.dataclass
class Plan:
  """The imagined plan and what the velocity predictor measures of it, on the device."""

  plan_logloss: jax.Array  # (Hmax,) corrected predicted log-loss after k predicted steps
  plan_raw_logloss: jax.Array  # (Hmax,) the dynamics model's own prediction
  plan_alpha: jax.Array  # (Hmax, G) corrected alpha
  plan_log_scale: jax.Array  # (Hmax,) the corrector's alpha log-scale
  plan_x: jax.Array  # (F,) normalised features the plan was made from
  plan_offset: jax.Array  # int32: predict steps already taken when the plan was made
  # Every predicted step is alpha . velocity, so the sums of the alphas give the segment exactly and
  # a rollback needs no snapshot of the params.
  alpha_since_good: jax.Array  # (G,) sum of alphas since the last validated-good point
  rollback_alpha: jax.Array  # (G,) to subtract at the next CORRECT entry (0 = nothing)
  one_step_pred: jax.Array  # predicted log-loss of the next real step
  agreement: jax.Array  # the ensemble's agreement on the plan
  accuracy: jax.Array  # recent realised accuracy of the predictions
  # Relative errors |L/L_hat - 1| of recent predictions (one-step in FULL, validations in PREDICT).
  errors: jax.Array  # (A,)
  errors_valid: jax.Array  # (A,) bool
  errors_pos: jax.Array  # int32
  # Per-group velocity norms as of the last real step (for logs; predicted steps leave v unchanged).
  velocity_norm: jax.Array  # (G,)


@flax.struct.dataclass
class VelocityState:
  velocity: Any  # params-shaped
  dynamics: dynamics_lib.DynamicsState
  corrector: corrector_lib.CorrectorState
  history: History
  plan: Plan


def init_plan(*, max_predict_steps: int, n_groups: int, feature_dim: int, accuracy_window: int) -> Plan:
  """An empty plan: no confidence, nothing to roll back."""
  z = lambda *shape, dtype=jnp.float32: jnp.zeros(shape, dtype)  # noqa: E731
  hmax, g = max_predict_steps, n_groups
  return Plan(
    plan_logloss=z(hmax),
    plan_raw_logloss=z(hmax),
    plan_alpha=z(hmax, g),
    plan_log_scale=z(hmax),
    plan_x=z(feature_dim),
    plan_offset=z(dtype=jnp.int32),
    alpha_since_good=z(g),
    rollback_alpha=z(g),
    one_step_pred=z(),
    agreement=z(),
    accuracy=z(),
    errors=z(accuracy_window),
    errors_valid=z(accuracy_window, dtype=bool),
    errors_pos=z(dtype=jnp.int32),
    velocity_norm=z(g),
  )


@dataclasses.dataclass(frozen=True)
class VelocitySettings:
  """The velocity predictor's static settings (`hybrid.velocity`; `HybridContext.settings`)."""

  rssm: dynamics_lib.RSSMConfig
  velocity_beta: float
  constant_alpha: float  # > 0: the ablation, every predicted step uses this alpha (no RSSM)
  zero_alpha: bool  # the control arm: every predicted step uses alpha = 0 (moves no weight)
  corrector_enabled: bool  # False: the corrector is neither applied nor trained
  window: int
  corrector_hidden: int
  corrector_lr: float
  corrector_capacity: int
  accuracy_window: int
  history_size: int
  validate_every: int  # a forward-pass validation every N predicted steps (and at the horizon)
  divergence_tolerance: float  # relative excess of measured over predicted loss that ends PREDICT
