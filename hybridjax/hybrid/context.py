"""What the hybrid step functions close over (`HybridContext`, static), and what each step kind
reports to the controller transition (`StepInfo`, traced)."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from hybridjax.hybrid import groups as groups_lib
from hybridjax.optim import LossFn


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
  """The static knobs the controller reads."""

  enable_predict: bool
  warmup_steps: int
  full_steps: int
  max_predict_steps: int
  confidence_threshold: float
  correct_steps: int
  correction_interval: int
  grad_explosion_factor: float
  loss_spike_sigma: float
  max_prediction_failures: int
  cooldown_steps: int


@dataclasses.dataclass(frozen=True)
class HybridContext:
  """Everything static the step functions close over: functions, shapes and settings.

  Values that vary between runs of a sweep (the learning-rate schedule) are not here: they are
  runtime arguments, so one compiled step serves them all. `method` is the training method's module
  (`hybridjax.methods`: its transitions, state and metrics) and `settings` its own static settings
  (`method.make_settings`); nothing else here belongs to one method.
  """

  loss_fn: LossFn
  tx: optax.GradientTransformation
  groups: groups_lib.ParamGroups
  control: ControllerSettings
  grad_accum: int
  total_steps: int
  method: Any  # the method's module
  settings: Any  # the method's static settings (hashable)
  averaging_beta: float | None = None  # the train state's params average (`trainer.averaging`), or None
  # Outer momentum (K, eta, mu) from `optim.outer_*`, or None (a method that composes with it reads
  # its state in the train state).
  outer: tuple[int, float, float] | None = None


@flax.struct.dataclass
class StepInfo:
  """The per-step facts every step kind returns (one structure for every transition, as the fused step needs)."""

  loss: jax.Array  # the measured loss (real steps, validated predicted steps), else the predicted one
  predicted_loss: jax.Array  # the plan's loss for this step (real steps: the next plan's first)
  grad_norm: jax.Array  # 0 in predicted steps
  was_real: jax.Array  # bool: the step had a backward pass
  finite: jax.Array  # bool: a real step's loss and gradient were finite (True for predicted steps)
  explosion: jax.Array  # bool: health check of a real step
  spike: jax.Array  # bool: health check of a real step
  validated: jax.Array  # bool: a predicted step measured the real loss with a forward pass
  diverged: jax.Array  # bool: that measurement exceeded the prediction or the start by the tolerance
  nonfinite_prediction: jax.Array  # bool: that measurement, or the plan, was not finite
  rolled_back: jax.Array  # bool: the step ended a segment that the method rolls back at the CORRECT entry
  alpha: jax.Array  # (G,) the per-group move this step applied (0 in real steps)
  forwards: jax.Array  # int32: forward passes beyond a real step's own (validations, probes)
  batch_consumed: jax.Array  # bool: the step used its batch (a jump only probes it; the next step trains on it)
  # bool: the framework discarded this predicted step, which left a non-finite value in the params or
  # the method's state (`step.discard_nonfinite`): the state is the one before it; it counts as a
  # non-finite prediction.
  discarded: jax.Array
  # The method's own per-step facts for its `on_transition` (a fixed structure for all its
  # transitions, `method.step_extra`), or None.
  extra: Any = None

  @classmethod
  def real(
    cls,
    *,
    loss: Any,
    grad_norm: Any,
    finite: Any,
    explosion: Any,
    spike: Any,
    n_groups: int,
    predicted_loss: Any = jnp.nan,
    rolled_back: Any = False,
    forwards: Any = 0,
    extra: Any = None,
  ) -> StepInfo:
    """A real step's facts: one backward pass, its batch used, no weight moved by a prediction
    (`rolled_back`: it ended a segment the method rolls back at the CORRECT entry)."""
    return make_step_info(
      loss=loss,
      predicted_loss=predicted_loss,
      grad_norm=grad_norm,
      was_real=True,
      finite=finite,
      explosion=explosion,
      spike=spike,
      validated=False,
      diverged=False,
      nonfinite_prediction=False,
      rolled_back=rolled_back,
      alpha=jnp.zeros((n_groups,)),
      forwards=forwards,
      extra=extra,
    )

  @classmethod
  def predicted(
    cls,
    *,
    alpha: Any,
    loss: Any = jnp.nan,
    predicted_loss: Any = jnp.nan,
    validated: Any = False,
    diverged: Any = False,
    nonfinite_prediction: Any = False,
    rolled_back: Any = False,
    forwards: Any = None,
    batch_consumed: Any = True,
    extra: Any = None,
  ) -> StepInfo:
    """A predicted step's facts: no backward pass; `alpha` is the (G,) per-group move it applied,
    `forwards` its forward passes (default: one if it `validated`)."""
    return make_step_info(
      loss=loss,
      predicted_loss=predicted_loss,
      grad_norm=0.0,
      was_real=False,
      finite=True,
      explosion=False,
      spike=False,
      validated=validated,
      diverged=diverged,
      nonfinite_prediction=nonfinite_prediction,
      rolled_back=rolled_back,
      alpha=alpha,
      forwards=forwards,
      batch_consumed=batch_consumed,
      extra=extra,
    )


def make_step_info(
  *,
  loss,
  predicted_loss,
  grad_norm,
  was_real,
  finite,
  explosion,
  spike,
  validated,
  diverged,
  nonfinite_prediction,
  alpha,
  rolled_back=False,
  forwards=None,
  batch_consumed=True,
  discarded=False,
  extra=None,
) -> StepInfo:
  """A `StepInfo` with every field cast to its dtype, so all branches return identical types."""

  def f32(v):
    return jnp.asarray(v, jnp.float32)

  def b(v):
    return jnp.asarray(v, bool)

  if forwards is None:
    forwards = jnp.asarray(validated, jnp.int32)
  return StepInfo(
    loss=f32(loss),
    predicted_loss=f32(predicted_loss),
    grad_norm=f32(grad_norm),
    was_real=b(was_real),
    finite=b(finite),
    explosion=b(explosion),
    spike=b(spike),
    validated=b(validated),
    diverged=b(diverged),
    nonfinite_prediction=b(nonfinite_prediction),
    rolled_back=b(rolled_back),
    alpha=f32(alpha),
    forwards=jnp.asarray(forwards, jnp.int32),
    batch_consumed=b(batch_consumed),
    discarded=b(discarded),
    extra=extra,
  )
