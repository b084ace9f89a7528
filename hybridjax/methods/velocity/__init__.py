"""The velocity predictor (`hybrid.method='velocity'`, the default): predicted steps along the
velocity, planned by an online RSSM (docs/design.md, "Steps").

  real step      the optimizer update, then the velocity EMA of updates, the history, one RSSM
                 training step and the imagined plan of the next PREDICT phase (`full_step`)
  predicted step theta <- theta + sum_g alpha_{g,k} velocity_g, validated by a forward pass every
                 `validate_every` steps (`predict_step`)
  CORRECT entry  theta <- theta - sum_g A_g velocity_g: the exact rollback of what diverged, with no
                 snapshot of the params (`correct_step`)

Its state (`plan.VelocityState`): the params-sized velocity (sharded like the params, the default), the
RSSM, the residual corrector, the history ring buffers and the plan. Its control arm
(`velocity.zero_alpha`) makes the same decisions with alpha = 0: its predicted steps move no weight.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from hybridjax import schema
from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid import trajectory as trajectory_lib
from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.phases import BRANCH_NAMES, Branch
from hybridjax.hybrid.state import Controller, HybridState
from hybridjax.methods.velocity import corrector as corrector_lib
from hybridjax.methods.velocity import features as features_lib
from hybridjax.methods.velocity.correct import correct_step as correct_step
from hybridjax.methods.velocity.plan import VelocitySettings, VelocityState, init_plan
from hybridjax.methods.velocity.predict import predict_step as predict_step
from hybridjax.methods.velocity.real import full_step as full_step  # with the two above: its transitions
from hybridjax.models import rssm as dynamics_lib

NAME = "velocity"
CONFIG_KEY = "velocity"
# The control arm: the same decisions, but no predicted step moves a weight (alpha = 0).
CONTROL = {"velocity.zero_alpha": True}


F = schema.Field
_int, _num = schema.check_int, schema.check_num
# The `hybrid.velocity` block.
FIELDS: tuple[schema.Field, ...] = (
  F("validate_every", 2, _int(1), "forward-pass validation every N predicted steps (and at the horizon)"),
  F("divergence_tolerance", 0.05, _num(0.0, lo_open=True), "real over predicted loss excess ending PREDICT"),
  F("beta", 0.99, _num(0.0, 1.0, hi_open=True), "EMA of the trajectory memory: slow, it tracks the drift"),
  F("constant_alpha", 0.0, _num(0.0, 10.0), "> 0: ablation, every predicted step uses this alpha (no RSSM)"),
  F("zero_alpha", False, schema.check_bool, "True: the control arm, predicted steps move nothing (alpha = 0)"),
  F("history_size", 64, _int(4, 4096), "ring-buffer length (steps)"),
  F("window", 32, _int(2), "truncated-BPTT window of the dynamics model"),
  F("accuracy_window", 8, _int(1, 1024), "recent validations that feed confidence"),
  F("rssm.deter", 256, _int(1), "the RSSM's GRU state size"),
  F("rssm.latent", 32, _int(1), "its Gaussian latent size"),
  F("rssm.hidden", 256, _int(1), "its MLP width"),
  F("rssm.ensemble", 3, _int(1, 64), "its independently initialised members"),
  F("rssm.free_bits", 1.0, _num(0.0), "its KL free bits in nats (per step)"),
  F("rssm.learning_rate", 1e-3, _num(0.0, lo_open=True), "its Adam learning rate"),
  F("corrector.enabled", True, schema.check_bool, "False: plans use the RSSM's raw output; no corrector is trained"),
  F("corrector.hidden", 64, _int(1), "the residual corrector's MLP width"),
  F("corrector.learning_rate", 1e-3, _num(0.0, lo_open=True), "its learning rate"),
  F("corrector.history", 32, _int(2, 4096), "its ring buffer of observed residuals (entries)"),
)


def check(config: ml_collections.ConfigDict) -> list[str]:
  """Relations between the block's fields."""
  v = config.hybrid.velocity
  errors = []
  if v.window > v.history_size:
    errors.append(
      f"--config.hybrid.velocity.window ({v.window}) must be <= --config.hybrid.velocity.history_size "
      f"({v.history_size})"
    )
  if v.accuracy_window > v.history_size:
    errors.append(
      f"--config.hybrid.velocity.accuracy_window ({v.accuracy_window}) must be <= "
      f"--config.hybrid.velocity.history_size ({v.history_size})"
    )
  if v.zero_alpha and v.constant_alpha > 0:
    errors.append(
      "--config.hybrid.velocity.zero_alpha (the control arm) and --config.hybrid.velocity.constant_alpha "
      f"({v.constant_alpha}) exclude each other: set one"
    )
  return errors


def make_settings(hybrid: ml_collections.ConfigDict, *, groups: groups_lib.ParamGroups) -> VelocitySettings:
  v = hybrid.velocity
  rssm = dynamics_lib.RSSMConfig(
    feature_dim=features_lib.feature_dim(groups),
    n_groups=groups.n_groups,
    deter=v.rssm.deter,
    latent=v.rssm.latent,
    hidden=v.rssm.hidden,
    ensemble=v.rssm.ensemble,
    free_bits=float(v.rssm.free_bits),
    learning_rate=float(v.rssm.learning_rate),
  )
  return VelocitySettings(
    rssm=rssm,
    velocity_beta=float(v.beta),
    constant_alpha=float(v.constant_alpha),
    zero_alpha=bool(v.zero_alpha),
    corrector_enabled=bool(v.corrector.enabled),
    window=v.window,
    corrector_hidden=v.corrector.hidden,
    corrector_lr=float(v.corrector.learning_rate),
    corrector_capacity=v.corrector.history,
    accuracy_window=v.accuracy_window,
    history_size=v.history_size,
    validate_every=v.validate_every,
    divergence_tolerance=float(v.divergence_tolerance),
  )


def init(ctx: HybridContext, params: Any, rng: jax.Array) -> VelocityState:
  """Zero velocity, a fresh RSSM and corrector, empty history and plan."""
  s: VelocitySettings = ctx.settings
  _, dyn_rng, corr_rng = jax.random.split(rng, 3)
  g, f = ctx.groups.n_groups, features_lib.feature_dim(ctx.groups)
  return VelocityState(
    velocity=jax.tree.map(jnp.zeros_like, params),
    dynamics=dynamics_lib.init_dynamics(dyn_rng, s.rssm),
    corrector=corrector_lib.init_corrector(corr_rng, f, s.corrector_capacity, s.corrector_hidden, s.corrector_lr),
    history=trajectory_lib.init_history(s.history_size, f, g),
    plan=init_plan(
      max_predict_steps=ctx.control.max_predict_steps, n_groups=g, feature_dim=f, accuracy_window=s.accuracy_window
    ),
  )


def step_extra(ctx: HybridContext) -> jax.Array:
  """The per-step fact `on_transition` reads: the (G,) alphas of the segment to roll back."""
  return jnp.zeros((ctx.groups.n_groups,), jnp.float32)


def on_transition(
  ctx: HybridContext, state: VelocityState, before: Controller, after: Controller, info: StepInfo
) -> VelocityState:
  """A new PREDICT phase starts its alpha sums and plan offset at 0; an ended one leaves the alphas
  to roll back at the CORRECT entry. A step the framework discarded (`info.discarded`) applied no
  move, and `state` is the state before it: what to roll back is then the alphas applied since the
  last good validation before it, not the step's own report (which counts its move)."""
  del ctx
  entering = controller_lib.entering_predict(before, after)
  done = controller_lib.predict_done(before, after)
  p = state.plan
  rollback = jnp.where(info.discarded, p.alpha_since_good, info.extra)
  return state.replace(
    plan=p.replace(
      alpha_since_good=jnp.where(entering, 0.0, p.alpha_since_good),
      plan_offset=jnp.where(entering, 0, p.plan_offset),
      rollback_alpha=jnp.where(done, rollback, p.rollback_alpha),
    )
  )


def metrics(ctx: HybridContext, state: HybridState, info: StepInfo) -> dict[str, jax.Array]:
  del ctx, info
  return {"velocity_norm": state.method.plan.velocity_norm}  # (G,) per-group velocity norms


def log_view(state: VelocityState) -> Any:
  """What a log record reads of the state (fetched with the log's one transfer)."""
  return state.plan


def log_fields(view: Any) -> dict[str, Any]:
  """The log record's fields from the fetched `log_view`."""
  return {"accuracy": float(view.accuracy), "agreement": float(view.agreement)}


def step_kind(row: dict[str, Any]) -> str:
  """A step's cost class from its trace record: its transition, and for a predicted step whether it
  ran a validation forward."""
  if int(row["branch"]) == Branch.PREDICT_STEP:
    return "predict_step+validation" if row["measured"] else "predict_step"
  return BRANCH_NAMES[int(row["branch"])]
