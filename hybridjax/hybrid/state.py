"""`HybridState`: everything hybrid training carries, as one pytree (docs/design.md, "State").

  HybridState
    train       params, opt_state, step          what a plain optax loop has
    controller  the generic controller: phase, counters, confidence, horizon, loss statistics, health
    method      the training method's own state (`hybridjax.methods`): e.g. the velocity
                predictor's velocity, RSSM, corrector, history and plan, or the jump predictor's
                slow EMA, forecaster and jump counters; nothing of any other method
    rng

Every leaf is a fixed-shape jax array, so the whole state is donated to the jitted step and its
buffers are reused in place.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from hybridjax.hybrid.phases import EVENT_NAMES, Branch, Exit, Phase
from hybridjax.optim import TrainState


@flax.struct.dataclass
class Controller:
  """The generic controller's whole state: the phase machine, the real steps' loss statistics and
  health, and the counters, as jnp scalars on the device. A method's own bookkeeping lives in its
  state (`HybridState.method`), never here."""

  phase: jax.Array  # int32 `Phase`
  steps_in_phase: jax.Array  # int32
  next_branch: jax.Array  # int32 `Branch`: the step kind the next call runs
  horizon: jax.Array  # int32, the current (or next) PREDICT horizon H <= max_predict_steps
  # Set by the method's real steps: PREDICT may start when it reaches `confidence_threshold`.
  confidence: jax.Array
  start_logloss: jax.Array  # the smoothed log-loss when the current PREDICT phase started
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
  # Health.
  cooldown: jax.Array  # int32
  consecutive_failures: jax.Array  # int32
  events: jax.Array  # (len(EVENT_NAMES),) int32
  # Of the non-finite events, those of predicted steps (a non-finite validation or plan, or a
  # discarded step), and the predicted steps discarded for leaving a non-finite value in the params
  # or the method's state: what names the method, not the optimizer, when a run diverges.
  nonfinite_predicted: jax.Array  # int32
  discarded: jax.Array  # int32
  # Counters.
  phase_steps: jax.Array  # (len(Phase),) int32: steps taken in each phase
  backward_passes: jax.Array  # int32
  forward_passes: jax.Array  # int32 (forwards beyond the real steps' own: validations, probes)
  predict_phases: jax.Array  # int32
  rollbacks: jax.Array  # int32
  # The data position: batches the run has used. A step may leave its batch for the next one (a
  # jump probes it), so this can fall behind the schedule step (`TrainState.step`).
  batches: jax.Array  # int32


@flax.struct.dataclass
class HybridState:
  train: TrainState
  controller: Controller
  method: Any  # the method's own state (`method.init`), or None
  rng: jax.Array


def init_controller() -> Controller:
  """The generic controller at the start of a run (WARMUP, nothing counted)."""
  f32 = lambda v=0.0: jnp.asarray(v, jnp.float32)  # noqa: E731
  i32 = lambda v=0: jnp.asarray(v, jnp.int32)  # noqa: E731
  return Controller(
    phase=i32(Phase.WARMUP),
    steps_in_phase=i32(),
    next_branch=i32(Branch.FULL_STEP),
    horizon=i32(1),
    confidence=f32(),
    start_logloss=f32(),
    last_exit=i32(Exit.NONE),
    ema_fast=f32(),
    ema_slow=f32(),
    loss_mean=f32(),
    loss_var=f32(),
    grad_norm_ema=f32(),
    real_count=i32(),
    last_logloss=f32(),
    prev_was_real=jnp.asarray(False),
    cooldown=i32(),
    consecutive_failures=i32(),
    events=jnp.zeros((len(EVENT_NAMES),), jnp.int32),
    nonfinite_predicted=i32(),
    discarded=i32(),
    phase_steps=jnp.zeros((len(Phase),), jnp.int32),
    backward_passes=i32(),
    forward_passes=i32(),
    predict_phases=i32(),
    rollbacks=i32(),
    batches=i32(),
  )
