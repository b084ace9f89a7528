"""`full_step`: the velocity predictor's real gradient step plus the trajectory bookkeeping (docs/design.md, "Steps").

Runs in WARMUP, FULL and CORRECT, and as a micro-correction inside PREDICT. On top of the optimizer
update it shares with the baseline (`optim.guarded_update`), it

1. observes the step: loss and gradient statistics, health checks, the error of the last one-step
   prediction (`observe_real_step`);
2. updates the trajectory memory: the velocity EMA of real updates and the history ring buffers
   (`update_trajectory`);
3. trains the dynamics model one step on the history window (`train_dynamics`);
4. imagines the plan the next PREDICT phase will follow (`plan_predict_phase`).

A non-finite loss or gradient applies nothing: params, optimizer state, velocity, history, dynamics
and plan keep their values.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid import trajectory as trajectory_lib
from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.phases import Phase
from hybridjax.hybrid.real_step import real_update
from hybridjax.hybrid.state import Controller, HybridState
from hybridjax.hybrid.trajectory import History, history_window
from hybridjax.methods.velocity import corrector as corrector_lib
from hybridjax.methods.velocity import features as features_lib
from hybridjax.methods.velocity.plan import Plan, VelocityState
from hybridjax.models import rssm as dynamics_lib
from hybridjax.optim import (
  Batch,
  Schedule,
  next_train_state,
  tree_where,
)


def agreement(ensemble_logloss: jax.Array, tolerance: float) -> jax.Array:
  """Ensemble agreement in (0, 1]: exp(-spread / log(1 + tolerance)).

  `ensemble_logloss` is (E, H): each member's imagined log-loss over the horizon; the spread is the
  member standard deviation, averaged over the horizon.
  """
  return jnp.exp(-dynamics_lib.ensemble_disagreement(ensemble_logloss) / jnp.log1p(tolerance))


def observe_real_step(
  ctx: HybridContext, state: HybridState, logloss: jax.Array, grad_norm: jax.Array, finite: jax.Array
) -> tuple[Controller, Plan, jax.Array, jax.Array]:
  """The controller's loss/gradient statistics and health checks after a real step, and the error
  of the one-step prediction made for it. Returns (controller, plan, grad_explosion, loss_spike)."""
  c, explosion, spike = controller_lib.update_real_stats(state.controller, logloss, grad_norm, finite, ctx.control)
  m: VelocityState = state.method
  plan = controller_lib.push_error(
    m.plan,
    controller_lib.relative_error(logloss, m.plan.one_step_pred),
    finite & c.prev_was_real & (m.history.count > 0),
  )
  return c, plan, explosion, spike


def update_velocity(velocity: Any, updates: Any, beta: float, finite: jax.Array) -> Any:
  """velocity <- beta * velocity + (1 - beta) * update, leafwise; unchanged when not `finite`."""
  return jax.tree.map(lambda v, u: jnp.where(finite, beta * v + (1.0 - beta) * u.astype(v.dtype), v), velocity, updates)


def update_trajectory(
  ctx: HybridContext,
  state: HybridState,
  c: Controller,
  *,
  loss: jax.Array,
  logloss: jax.Array,
  grad_norm: jax.Array,
  grads: Any,
  updates: Any,
  params: Any,
  lr: jax.Array,
  finite: jax.Array,
) -> tuple[Any, History, jax.Array]:
  """Velocity and history bookkeeping of one real step. Returns (velocity, history, x).

  The history's previous entry gets its alpha target, the least-squares scale of this update
  along the velocity that preceded it; this step's feature vector `x` and log-loss are appended.
  """
  groups, v, h = ctx.groups, state.method.velocity, state.method.history
  grad_sq = groups_lib.group_sq_norms(groups, grads)
  update_sq = groups_lib.group_sq_norms(groups, updates)
  uv = groups_lib.group_dots(groups, updates, v)
  v_sq = groups_lib.group_sq_norms(groups, v)
  param_sq = groups_lib.group_sq_norms(groups, params)
  velocity = update_velocity(v, updates, ctx.settings.velocity_beta, finite)

  n = h.features.shape[0]
  prev = (h.pos - 1) % n
  alpha_star = jnp.clip(uv / jnp.maximum(v_sq, 1e-30), -ctx.settings.rssm.alpha_max, ctx.settings.rssm.alpha_max)
  write_target = finite & c.prev_was_real & (h.count > 0) & jnp.all(v_sq > 0)
  alpha_target = jnp.where(write_target, h.alpha_target.at[prev].set(alpha_star), h.alpha_target)
  x = features_lib.feature_vector(
    loss=loss,
    ema_fast=c.ema_fast,
    ema_slow=c.ema_slow,
    grad_norm=grad_norm,
    lr=lr,
    progress=state.train.step.astype(jnp.float32) / ctx.total_steps,
    phase=c.phase,
    grad_sq=grad_sq,
    update_sq=update_sq,
    param_sq=param_sq,
    update_velocity_dot=uv,
    velocity_sq=v_sq,
  )
  normalizer = trajectory_lib.update_normalizer(h.normalizer, x, max_count=float(ctx.settings.history_size * 4))
  h = h.replace(
    features=jnp.where(finite, h.features.at[h.pos].set(x), h.features),
    logloss=jnp.where(finite, h.logloss.at[h.pos].set(logloss), h.logloss),
    alpha_target=alpha_target.at[h.pos].set(jnp.where(finite, 0.0, alpha_target[h.pos])),
    normalizer=tree_where(finite, normalizer, h.normalizer),
    pos=jnp.where(finite, (h.pos + 1) % n, h.pos),
    count=jnp.where(finite, jnp.minimum(h.count + 1, n), h.count),
  )
  return velocity, h, x


def train_dynamics(
  ctx: HybridContext, dynamics: dynamics_lib.DynamicsState, window: dict[str, jax.Array], rng: jax.Array
) -> dynamics_lib.DynamicsState:
  """One training step of the RSSM on the history window (online truncated BPTT)."""
  dyn, _ = dynamics_lib.train_step(dynamics, window, rng, ctx.settings.rssm)
  return dyn


def plan_predict_phase(
  ctx: HybridContext,
  c: Controller,
  p: Plan,
  dynamics: dynamics_lib.DynamicsState,
  corrector: corrector_lib.CorrectorState,
  window: dict[str, jax.Array],
  x_now: jax.Array,
  logloss: jax.Array,
  velocity: Any,
  rng: jax.Array,
  finite: jax.Array,
) -> tuple[Controller, Plan, jax.Array]:
  """Imagines the next PREDICT phase and stores its plan (log-loss and alpha per step), with the
  confidence it earns in the controller. Returns (controller, plan, rollback alpha).

  A real step inside PREDICT (a micro-correction) commits the segment so far and restarts the plan;
  a non-finite one keeps the old plan and rolls the segment back.
  """
  imagined = dynamics_lib.imagine(dynamics, window, ctx.control.max_predict_steps, rng, ctx.settings.rssm)
  # Re-anchor the imagined curve on the smoothed loss: one batch's loss is too noisy a start.
  ens_logloss = imagined["logloss"] - logloss + c.ema_fast
  raw_logloss = jnp.mean(ens_logloss, axis=0)
  raw_alpha = jnp.mean(imagined["alpha"], axis=0)
  pos = (jnp.arange(ctx.control.max_predict_steps, dtype=jnp.float32) + 1.0) / ctx.control.max_predict_steps
  if ctx.settings.corrector_enabled:
    delta, log_scale = corrector_lib.apply_corrector(corrector, x_now, pos, ctx.settings.corrector_hidden)
  else:
    delta, log_scale = jnp.zeros_like(pos), jnp.zeros_like(pos)
  if ctx.settings.constant_alpha > 0:  # the ablation: velocity extrapolation without the RSSM's alphas
    plan_alpha = jnp.full_like(raw_alpha, ctx.settings.constant_alpha)
    log_scale = jnp.zeros_like(log_scale)
  elif ctx.settings.zero_alpha:  # the control arm: the same phases, but no predicted step moves a weight
    plan_alpha = jnp.zeros_like(raw_alpha)
  else:
    plan_alpha = raw_alpha * jnp.exp(log_scale)[:, None]
  agree = agreement(ens_logloss, ctx.settings.divergence_tolerance)
  acc = controller_lib.accuracy(p, ctx.settings.divergence_tolerance)

  in_predict = c.phase == Phase.PREDICT
  rollback = jnp.where(in_predict & ~finite, p.alpha_since_good, 0.0)

  def keep(new, old):
    return jnp.where(finite, new, old)

  p = p.replace(
    plan_logloss=keep(raw_logloss + delta, p.plan_logloss),
    plan_raw_logloss=keep(raw_logloss, p.plan_raw_logloss),
    plan_alpha=keep(plan_alpha, p.plan_alpha),
    plan_log_scale=keep(log_scale, p.plan_log_scale),
    plan_x=keep(x_now, p.plan_x),
    plan_offset=jnp.where(in_predict, c.steps_in_phase + 1, p.plan_offset).astype(jnp.int32),
    alpha_since_good=jnp.where(in_predict & finite, 0.0, p.alpha_since_good),
    one_step_pred=keep(jnp.mean(imagined["next_logloss"]), p.one_step_pred),
    agreement=keep(agree, p.agreement),
    accuracy=keep(acc, p.accuracy),
    velocity_norm=keep(jnp.sqrt(groups_lib.group_sq_norms(ctx.groups, velocity)), p.velocity_norm),
  )
  c = c.replace(confidence=keep(agree * acc, c.confidence))
  return c, p, rollback


def full_step(ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule) -> tuple[HybridState, StepInfo]:
  """A real gradient step plus the trajectory bookkeeping. A non-finite update is never applied."""
  tr = state.train
  loss, grads, grad_norm, finite, lr, params, opt_state, updates = real_update(ctx, tr, batch, schedule)

  logloss = groups_lib.safe_log(loss)
  m: VelocityState = state.method
  c, plan, explosion, spike = observe_real_step(ctx, state, logloss, grad_norm, finite)
  velocity, history, x = update_trajectory(
    ctx,
    state,
    c,
    loss=loss,
    logloss=logloss,
    grad_norm=grad_norm,
    grads=grads,
    updates=updates,
    params=params,
    lr=lr,
    finite=finite,
  )

  rng, train_rng, imagine_rng = jax.random.split(state.rng, 3)
  window = history_window(history, ctx.settings.window)
  dyn = train_dynamics(ctx, m.dynamics, window, train_rng)
  x_now = trajectory_lib.normalize(history.normalizer, x)
  c, plan, rollback = plan_predict_phase(
    ctx, c, plan, dyn, m.corrector, window, x_now, logloss, velocity, imagine_rng, finite
  )

  new_state = state.replace(
    train=next_train_state(tr, params, opt_state, finite),
    method=m.replace(velocity=velocity, dynamics=tree_where(finite, dyn, m.dynamics), history=history, plan=plan),
    controller=c,
    rng=rng,
  )
  info = StepInfo.real(
    loss=loss,
    predicted_loss=jnp.exp(plan.plan_logloss[0]),
    grad_norm=grad_norm,
    finite=finite,
    explosion=explosion,
    spike=spike,
    n_groups=ctx.groups.n_groups,
    rolled_back=jnp.any(rollback != 0),
    extra=rollback,
  )
  return new_state, info
