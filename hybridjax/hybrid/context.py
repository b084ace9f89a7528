"""What the hybrid step functions close over (`HybridContext`, static), and what each step kind
reports to the controller transition (`StepInfo`, traced)."""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import optax

from hybridjax.hybrid import dynamics as dynamics_lib
from hybridjax.hybrid import features as features_lib
from hybridjax.optim import LossFn


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
  """The static knobs the controller reads."""

  enable_predict: bool
  warmup_steps: int
  full_steps: int
  max_predict_steps: int
  confidence_threshold: float
  divergence_tolerance: float
  correct_steps: int
  correction_interval: int
  validate_every: int
  grad_explosion_factor: float
  loss_spike_sigma: float
  max_prediction_failures: int
  cooldown_steps: int


@dataclasses.dataclass(frozen=True)
class JumpSettings:
  """The jump predictor's static knobs (`hybrid.jump`, docs/design.md "Jumps")."""

  horizons: tuple[int, ...]  # candidate k, scored one at a time on the probe batch
  scales: tuple[float, ...]  # candidate move scales s: a candidate moves s k r and advances k
  margin: float  # accept only if the probe loss falls below (1 - margin) x the no-jump loss
  trend_credit: float  # ... and below it by this fraction of the progress k real steps would make
  slow_beta: float  # the slow EMA of the params; the fast one is the averaging EMA
  start_fraction: float  # no jump before this fraction of the schedule
  stop_fraction: float  # no jump may end past this fraction of the schedule
  skip_control: bool  # True: an accepted jump advances the schedule by k and moves no weight


@dataclasses.dataclass(frozen=True)
class ForecastSettings:
  """The forecaster's static knobs (`hybrid.jump.forecaster`, docs/design.md "Forecast")."""

  every: int  # D: real steps between snapshots (one RSSM entry each)
  history: int  # snapshots kept (the RSSM's training window)
  train_steps: int  # RSSM optimizer steps at each snapshot
  min_agreement: float  # a candidate needs this ensemble agreement on its expected gain
  max_scale: float  # s_g is clipped to [0, max_scale]
  rssm: dynamics_lib.RSSMConfig


@dataclasses.dataclass(frozen=True)
class HybridContext:
  """Everything static the step functions close over: functions, shapes and settings.

  Values that vary between runs of a sweep (the learning-rate schedule) are not here: they are
  runtime arguments, so one compiled step serves them all.
  """

  loss_fn: LossFn
  tx: optax.GradientTransformation
  groups: features_lib.ParamGroups
  control: ControllerSettings
  rssm: dynamics_lib.RSSMConfig
  grad_accum: int
  velocity_beta: float
  constant_alpha: float  # > 0: the ablation, every predicted step uses this alpha (no RSSM)
  corrector_enabled: bool  # False: the corrector is neither applied nor trained
  window: int
  total_steps: int
  corrector_hidden: int
  corrector_lr: float
  corrector_capacity: int
  accuracy_window: int
  history_size: int
  averaging_beta: float | None = None  # the train state's params average (`trainer.averaging`), or None
  predictor: str = "velocity"  # 'velocity' (alpha . velocity steps) | 'jump' (`hybrid.jump`)
  jump: JumpSettings | None = None  # the jump predictor's settings (predictor='jump')
  # Outer momentum (K, eta, mu) from `optim.outer_*` (jump predictor only), or None. With it the
  # jump's drift is m (1 - mu) / K and no slow EMA is kept.
  outer: tuple[int, float, float] | None = None
  # The RSSM forecaster of the jump's s_g and expected gain (`hybrid.jump.forecast='rssm'`), or None.
  forecast: ForecastSettings | None = None

  @property
  def hmax(self) -> int:
    """The longest PREDICT horizon (the length of every plan)."""
    return self.control.max_predict_steps


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
  rollback_alpha: jax.Array  # (G,) alphas of the segment to roll back at the CORRECT entry
  alpha: jax.Array  # (G,) the alpha this step applied (0 in real steps)
  forwards: jax.Array  # int32: forward passes beyond a real step's own (validations, probes)
  batch_consumed: jax.Array  # bool: the step used its batch (a jump only probes it; the next step trains on it)


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
  rollback_alpha,
  alpha,
  forwards=None,
  batch_consumed=True,
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
    rollback_alpha=f32(rollback_alpha),
    alpha=f32(alpha),
    forwards=jnp.asarray(forwards, jnp.int32),
    batch_consumed=b(batch_consumed),
  )
