"""`HybridState`: everything hybrid training carries, as one pytree (docs/design.md, "State").

  HybridState
    train       params, opt_state, step          what a plain optax loop has
    velocity    params-shaped trajectory memory   (predictor='velocity'; None for 'jump')
    drift_memory  the slow EMA of the params      (predictor='jump'; None for 'velocity')
    forecast    the jump's RSSM forecaster        (hybrid.jump.forecast='rssm'; else None)
    dynamics    RSSM params + its opt_state + recurrent state            } predictor='velocity'
    corrector   residual corrector params + opt_state + its residual buffer } (None for 'jump')
    history     ring buffers: features, log-loss, alpha targets             }
    controller  phase, counters, confidence, horizon, the imagined plan, alpha sums, health
    rng

Every leaf is a fixed-shape jax array, so the whole state is donated to the jitted step and its
buffers are reused in place.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from hybridjax.hybrid import corrector as corrector_lib
from hybridjax.hybrid import dynamics as dynamics_lib
from hybridjax.hybrid import features as features_lib
from hybridjax.hybrid.phases import EVENT_NAMES, Branch, Exit, Phase
from hybridjax.optim import TrainState


@flax.struct.dataclass
class History:
  """Ring buffers of the last N real steps, in write order (slot `pos` is written next)."""

  features: jax.Array  # (N, F) raw feature vectors
  logloss: jax.Array  # (N,)
  alpha_target: jax.Array  # (N, G) ideal alpha for the update after each entry
  normalizer: features_lib.Normalizer
  pos: jax.Array  # int32
  count: jax.Array  # int32, saturates at N


@flax.struct.dataclass
class Controller:
  """The controller's whole state: jnp scalars and small arrays, on the device."""

  phase: jax.Array  # int32 `Phase`
  steps_in_phase: jax.Array  # int32
  next_branch: jax.Array  # int32 `Branch`: the step kind the next call runs
  horizon: jax.Array  # int32, the current (or next) PREDICT horizon H <= max_predict_steps
  confidence: jax.Array
  agreement: jax.Array
  accuracy: jax.Array
  # The plan imagined at the last real step: used verbatim by the next PREDICT phase.
  plan_logloss: jax.Array  # (Hmax,) corrected predicted log-loss after k predicted steps
  plan_raw_logloss: jax.Array  # (Hmax,) the dynamics model's own prediction
  plan_alpha: jax.Array  # (Hmax, G) corrected alpha
  plan_log_scale: jax.Array  # (Hmax,) the corrector's alpha log-scale
  plan_x: jax.Array  # (F,) normalised features the plan was made from
  plan_offset: jax.Array  # int32: predict steps already taken when the plan was made
  # PREDICT bookkeeping. Every predicted step is alpha . velocity, so the sums of the alphas give the
  # segment exactly and a rollback needs no snapshot of the params.
  start_logloss: jax.Array
  alpha_since_good: jax.Array  # (G,) sum of alphas since the last validated-good point
  rollback_alpha: jax.Array  # (G,) to subtract at the next CORRECT entry (0 = nothing)
  last_exit: jax.Array  # int32 `Exit`
  # Running statistics of real steps.
  ema_fast: jax.Array
  ema_slow: jax.Array
  loss_mean: jax.Array
  loss_var: jax.Array
  grad_norm_ema: jax.Array
  real_count: jax.Array  # int32
  last_logloss: jax.Array
  prev_was_real: jax.Array  # bool
  one_step_pred: jax.Array  # predicted log-loss of the next real step
  # Relative errors |L/L_hat - 1| of recent predictions (one-step in FULL, validations in PREDICT).
  errors: jax.Array  # (A,)
  errors_valid: jax.Array  # (A,) bool
  errors_pos: jax.Array  # int32
  # Health.
  cooldown: jax.Array  # int32
  consecutive_failures: jax.Array  # int32
  events: jax.Array  # (len(EVENT_NAMES),) int32
  # Counters.
  phase_steps: jax.Array  # (len(Phase),) int32: steps taken in each phase
  backward_passes: jax.Array  # int32
  forward_passes: jax.Array  # int32 (validation forwards in PREDICT)
  predict_phases: jax.Array  # int32
  rollbacks: jax.Array  # int32
  # Per-group velocity norms as of the last real step (for logs; predicted steps leave v unchanged).
  velocity_norm: jax.Array  # (G,)
  # The data position: batches the run has used. A jump probes its batch without consuming it, so
  # with jumps this falls behind the schedule step (`TrainState.step`).
  batches: jax.Array  # int32
  # Jumps (`hybrid.predictor='jump'`; zeros otherwise).
  jump_attempts: jax.Array  # int32: PREDICT steps that scored candidates
  jumps: jax.Array  # int32: accepted jumps
  jump_steps: jax.Array  # int32: schedule steps advanced by accepted jumps (sum of k)
  last_jump_k: jax.Array  # int32: k of the last attempt (0 = rejected)
  last_jump_scale: jax.Array  # the move scale s of the last attempt's candidate (0 = rejected)
  last_probe_gain: jax.Array  # relative probe-loss drop of the last attempt's best candidate
  group_scale: jax.Array  # (G,) s_g: a jump moves group g by s_g * k * r_g
  # Persisting gain of the last accepted jump, measured over the CORRECT phase after it: the mean
  # of (expected - measured) log-loss of its real steps, expected from the loss trend before it.
  persist_tracking: jax.Array  # bool: a CORRECT phase after an accepted jump is being measured
  persist_level: jax.Array  # log-loss level at the jump
  persist_trend: jax.Array  # log-loss change per real step before the jump
  persist_sum: jax.Array
  persist_n: jax.Array  # int32
  last_persisting_gain: jax.Array
  persisting_gain_sum: jax.Array  # over all measured jumps
  persisting_gain_count: jax.Array  # int32


@flax.struct.dataclass
class HybridState:
  train: TrainState
  velocity: Any  # params-shaped; None with predictor='jump'
  # The jump predictor's slow EMA of the params (an `optim.Averaging`); None otherwise. With the
  # train state's averaging EMA as the fast one it gives the drift (`hybrid.jump`).
  drift_memory: Any
  # The jump's RSSM forecaster (`hybrid.forecast.Forecast`) with `hybrid.jump.forecast='rssm'`, else None.
  forecast: Any
  dynamics: dynamics_lib.DynamicsState
  corrector: corrector_lib.CorrectorState
  history: History
  controller: Controller
  rng: jax.Array


def init_history(size: int, feature_dim: int, n_groups: int) -> History:
  return History(
    features=jnp.zeros((size, feature_dim), jnp.float32),
    logloss=jnp.zeros((size,), jnp.float32),
    alpha_target=jnp.zeros((size, n_groups), jnp.float32),
    normalizer=features_lib.init_normalizer(feature_dim),
    pos=jnp.zeros((), jnp.int32),
    count=jnp.zeros((), jnp.int32),
  )


def init_controller(*, max_predict_steps: int, n_groups: int, feature_dim: int, accuracy_window: int) -> Controller:
  f32 = lambda v=0.0: jnp.asarray(v, jnp.float32)  # noqa: E731
  i32 = lambda v=0: jnp.asarray(v, jnp.int32)  # noqa: E731
  hmax, g = max_predict_steps, n_groups
  return Controller(
    phase=i32(Phase.WARMUP),
    steps_in_phase=i32(),
    next_branch=i32(Branch.FULL_STEP),
    horizon=i32(1),
    confidence=f32(),
    agreement=f32(),
    accuracy=f32(),
    plan_logloss=jnp.zeros((hmax,), jnp.float32),
    plan_raw_logloss=jnp.zeros((hmax,), jnp.float32),
    plan_alpha=jnp.zeros((hmax, g), jnp.float32),
    plan_log_scale=jnp.zeros((hmax,), jnp.float32),
    plan_x=jnp.zeros((feature_dim,), jnp.float32),
    plan_offset=i32(),
    start_logloss=f32(),
    alpha_since_good=jnp.zeros((g,), jnp.float32),
    rollback_alpha=jnp.zeros((g,), jnp.float32),
    last_exit=i32(Exit.NONE),
    ema_fast=f32(),
    ema_slow=f32(),
    loss_mean=f32(),
    loss_var=f32(),
    grad_norm_ema=f32(),
    real_count=i32(),
    last_logloss=f32(),
    prev_was_real=jnp.asarray(False),
    one_step_pred=f32(),
    errors=jnp.zeros((accuracy_window,), jnp.float32),
    errors_valid=jnp.zeros((accuracy_window,), bool),
    errors_pos=i32(),
    cooldown=i32(),
    consecutive_failures=i32(),
    events=jnp.zeros((len(EVENT_NAMES),), jnp.int32),
    phase_steps=jnp.zeros((len(Phase),), jnp.int32),
    backward_passes=i32(),
    forward_passes=i32(),
    predict_phases=i32(),
    rollbacks=i32(),
    velocity_norm=jnp.zeros((g,), jnp.float32),
    batches=i32(),
    jump_attempts=i32(),
    jumps=i32(),
    jump_steps=i32(),
    last_jump_k=i32(),
    last_jump_scale=f32(),
    last_probe_gain=f32(),
    group_scale=jnp.ones((g,), jnp.float32),
    persist_tracking=jnp.asarray(False),
    persist_level=f32(),
    persist_trend=f32(),
    persist_sum=f32(),
    persist_n=i32(),
    last_persisting_gain=f32(),
    persisting_gain_sum=f32(),
    persisting_gain_count=i32(),
  )
