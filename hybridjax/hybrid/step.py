"""The hybrid step: the design card's three pure transitions, selected on the device.

  full_step      forward + backward + optimizer update, plus the trajectory bookkeeping (WARMUP,
                 FULL, CORRECT, micro-corrections in PREDICT)
  predict_step   no backward pass: theta <- theta + sum_g alpha_{g,k} velocity_g
  correct_step   the CORRECT entry: exact rollback of what diverged, corrector update, full step

`hybrid_step` runs the one `Controller.next_branch` names, then the controller transition
(`finish_step`); `hybrid_multi_step` runs K of them in one dispatch with `lax.scan`. The selection has
`lax.switch`'s semantics but updates the donated state in place (`switch_in_place`).
`make_phase_step` gives one transition plus the controller transition alone, for host dispatch.
Every function here is pure: jit it with the state donated (`donate_argnums=0`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid import corrector as corrector_lib
from hybridjax.hybrid import dynamics as dynamics_lib
from hybridjax.hybrid import forecast as forecast_lib
from hybridjax.hybrid import jump as jump_lib
from hybridjax.hybrid import state as state_lib
from hybridjax.hybrid.context import HybridContext, StepInfo, make_step_info
from hybridjax.hybrid.correct_step import correct_step
from hybridjax.hybrid.full_step import full_step
from hybridjax.hybrid.phases import Branch
from hybridjax.hybrid.predict_step import predict_step
from hybridjax.hybrid.state import HybridState
from hybridjax.optim import Batch, Schedule, init_outer_momentum, init_train_state

# The transitions `hybrid_step` selects between, indexed by `Branch`.
TRANSITIONS: tuple[Callable[..., tuple[HybridState, StepInfo]], ...] = (full_step, predict_step, correct_step)
assert [f.__name__ for f in TRANSITIONS] == [b.name.lower() for b in Branch]
# The jump predictor's: its real steps carry no trajectory model, and its CORRECT entry has nothing
# to roll back (a rejected jump changes nothing).
JUMP_TRANSITIONS: tuple[Callable[..., tuple[HybridState, StepInfo]], ...] = (
  jump_lib.jump_real_step,
  jump_lib.jump_step,
  jump_lib.jump_real_step,
)


def transitions(ctx: HybridContext) -> tuple[Callable[..., tuple[HybridState, StepInfo]], ...]:
  """The three transitions of `ctx.predictor`, indexed by `Branch`."""
  return JUMP_TRANSITIONS if ctx.predictor == "jump" else TRANSITIONS


StepFn = Callable[[HybridState, Batch, Schedule], tuple[HybridState, dict[str, jax.Array]]]


def init_hybrid_state(ctx: HybridContext, params: Any, rng: jax.Array) -> HybridState:
  """A fresh state around `params` (the optimizer is initialised here)."""
  rng, dyn_rng, corr_rng = jax.random.split(rng, 3)
  # The forecaster's key is folded from the state's, so adding it changes no other draw.
  forecast_rng = jax.random.fold_in(rng, 1)
  g, f = ctx.groups.n_groups, ctx.groups.feature_dim
  velocity = ctx.predictor == "velocity"
  return HybridState(
    train=init_train_state(
      params, ctx.tx, ctx.averaging_beta, None if ctx.outer is None else init_outer_momentum(params, *ctx.outer)
    ),
    velocity=jax.tree.map(jnp.zeros_like, params) if velocity else None,
    # The slow EMA of the jump's drift; outer momentum's m gives the drift when it runs.
    drift_memory=(
      jump_lib.init_drift_memory(params, ctx.jump.slow_beta) if ctx.predictor == "jump" and ctx.outer is None else None
    ),
    forecast=None if ctx.forecast is None else forecast_lib.init_forecast(ctx.forecast, params, forecast_rng),
    # The velocity predictor's one-step RSSM, corrector and per-step history: the jump predictor
    # uses none of them, and carrying them through its steps is not free (every donated leaf costs
    # its dispatch: their ~120 leaves made a real step ~9% dearer on the `long` benchmark's model).
    dynamics=dynamics_lib.init_dynamics(dyn_rng, ctx.rssm) if velocity else None,
    corrector=(
      corrector_lib.init_corrector(corr_rng, f, ctx.corrector_capacity, ctx.corrector_hidden, ctx.corrector_lr)
      if velocity
      else None
    ),
    history=state_lib.init_history(ctx.history_size, f, g) if velocity else None,
    controller=state_lib.init_controller(
      max_predict_steps=ctx.hmax, n_groups=g, feature_dim=f, accuracy_window=ctx.accuracy_window
    ),
    rng=rng,
  )


def finish_step(
  ctx: HybridContext, state: HybridState, info: StepInfo, phase_before: jax.Array, branch: jax.Array
) -> tuple[HybridState, dict[str, jax.Array]]:
  """Applies the controller transition and assembles the small dict of scalar measurements.

  `loss` is the measured loss (NaN in a predicted step that was not validated); `predicted_loss`
  is the plan's value for the step.
  """
  c = controller_lib.transition(state.controller, info, ctx.control)
  metrics = {
    "loss": info.loss,
    "predicted_loss": info.predicted_loss,
    "phase": phase_before,
    "branch": jnp.asarray(branch, jnp.int32),  # the transition that ran (`Branch`): what the step cost
    "confidence": c.confidence,
    "grad_norm": info.grad_norm,
    "step": state.train.step,
    "horizon": c.horizon,
    "measured": info.was_real | info.validated,
    "diverged": info.diverged | info.nonfinite_prediction,
    # Per-group vectors (G,): the alpha this step applied (0 in real steps), velocity norms.
    "alpha": info.alpha,
    "velocity_norm": c.velocity_norm,
  }
  if ctx.predictor == "jump":
    jumped = ~info.batch_consumed  # only a jump step leaves its batch for the next step
    metrics.update(
      jump_k=jnp.where(jumped, c.last_jump_k, 0),  # schedule steps this jump advanced (0: rejected)
      jump_scale=jnp.where(jumped, c.last_jump_scale, 0.0),  # its move: jump_scale * jump_k steps of drift
      probe_gain=jnp.where(jumped, c.last_probe_gain, jnp.nan),
      persisting_gain=c.last_persisting_gain,
    )
    if state.forecast is not None:
      f = state.forecast
      metrics.update(
        # The forecaster's expected persisting gain of this attempt's chosen candidate, its ensemble
        # agreement, and the calibration (realised / expected, learned over the accepted jumps).
        expected_gain=jnp.where(jumped, f.last_expected, jnp.nan),
        forecast_agreement=jnp.where(jumped, f.last_agreement, jnp.nan),
        calibration=f.calibration,
        # This real step took a snapshot (and trained the RSSM): a step kind of its own cost.
        snapshot=info.was_real & forecast_lib.takes_snapshot(ctx.forecast, c.real_count, info.finite),
      )
  return state.replace(controller=c), metrics


def make_phase_step(ctx: HybridContext, branch: int) -> StepFn:
  """One transition plus the controller transition, as a pure function (for host dispatch)."""
  transition = transitions(ctx)[branch]

  def step(state: HybridState, batch: Batch, schedule: Schedule):
    phase = state.controller.phase
    new_state, info = transition(ctx, state, batch, schedule)
    return finish_step(ctx, new_state, info, phase, branch)

  return step


def hybrid_step(
  ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule
) -> tuple[HybridState, dict[str, jax.Array]]:
  """One hybrid step: the transition `Controller.next_branch` selects, then the controller transition.

  The selection is `switch_in_place`, not `lax.switch`: XLA gives a conditional's results buffers of
  their own, so a `lax.switch` branch copies every leaf it passes through unchanged (a predicted step
  copied the optimizer state, the velocity and the RSSM) and the results are copied back into the
  donated state afterwards, whichever branch ran. See `switch_in_place`.
  """
  phase, branch = state.controller.phase, state.controller.next_branch
  new_state, info = switch_in_place(ctx, branch, state, batch, schedule)
  return finish_step(ctx, new_state, info, phase, branch)


def switch_in_place(
  ctx: HybridContext, branch: jax.Array, state: HybridState, batch: Batch, schedule: Schedule
) -> tuple[HybridState, StepInfo]:
  """`lax.switch(branch, TRANSITIONS, ...)` with the state updated in place.

  Each transition runs inside a `lax.while_loop` of one trip when selected and none otherwise. A
  while loop's input, body and output share one buffer per carried leaf, so the selected transition
  writes the donated state in place, exactly as its own jitted function does, with the same bits,
  and the ones not selected cost one predicate each.
  """
  branch = jnp.clip(branch, 0, len(TRANSITIONS) - 1)  # as lax.switch clamps its index
  g = state.controller.rollback_alpha.shape
  info = make_step_info(
    loss=0.0,
    predicted_loss=0.0,
    grad_norm=0.0,
    was_real=False,
    finite=False,
    explosion=False,
    spike=False,
    validated=False,
    diverged=False,
    nonfinite_prediction=False,
    rollback_alpha=jnp.zeros(g),
    alpha=jnp.zeros(g),
    forwards=0,
    batch_consumed=False,
  )
  for index, transition in enumerate(transitions(ctx)):

    def run_once(carry, transition=transition):
      _, s, _ = carry
      return (jnp.asarray(False), *transition(ctx, s, batch, schedule))

    _, state, info = jax.lax.while_loop(lambda carry: carry[0], run_once, (branch == index, state, info))
  return state, info


def hybrid_multi_step(
  ctx: HybridContext, state: HybridState, batches: Batch, schedule: Schedule
) -> tuple[HybridState, dict[str, jax.Array]]:
  """K hybrid steps in one dispatch (`lax.scan`); every leaf of `batches` has a leading axis K,
  and every metric of the result too."""
  return jax.lax.scan(lambda s, b: hybrid_step(ctx, s, b, schedule), state, batches)
