"""The real step every method shares: the baseline's optimizer update (`real_update`) and, with the
controller's loss statistics and health checks, the whole real step of a method that never predicts
(`baseline_step`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.groups import safe_log
from hybridjax.hybrid.state import HybridState
from hybridjax.optim import (
  Batch,
  Schedule,
  TrainState,
  global_norm,
  guarded_update,
  learning_rate,
  loss_and_grads,
  next_train_state,
)


class RealUpdate(NamedTuple):
  """What the optimizer update of a real step computed (`real_update`)."""

  loss: jax.Array  # float32
  grads: Any
  grad_norm: jax.Array
  finite: jax.Array  # the loss and the gradient norm are finite (else nothing is applied)
  lr: jax.Array
  params: Any  # the params after the update (the old ones when not `finite`)
  opt_state: Any
  updates: Any


def real_update(ctx: HybridContext, tr: TrainState, batch: Batch, schedule: Schedule) -> RealUpdate:
  """The baseline's optimizer update (the same functions `optim.train_step` runs, so the same bits):
  forward, backward, the guarded optax update. Every real step of every predictor starts here."""
  loss, grads = loss_and_grads(ctx.loss_fn, tr.params, batch, ctx.grad_accum)
  loss = loss.astype(jnp.float32)
  grad_norm = global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  lr = learning_rate(schedule, tr.step)
  params, opt_state, updates = guarded_update(ctx.tx, grads, tr.opt_state, tr.params, lr, finite)
  return RealUpdate(loss, grads, grad_norm, finite, lr, params, opt_state, updates)


def baseline_update(
  ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule
) -> tuple[HybridState, StepInfo, Any]:
  """`baseline_step`, also returning the optimizer's update (zero-free: the update as computed,
  applied only when `info.finite`), for a method that keeps something of it."""
  tr = state.train
  loss, _, grad_norm, finite, _, params, opt_state, updates = real_update(ctx, tr, batch, schedule)
  c, explosion, spike = controller_lib.update_real_stats(
    state.controller, safe_log(loss), grad_norm, finite, ctx.control
  )
  info = StepInfo.real(
    loss=loss, grad_norm=grad_norm, finite=finite, explosion=explosion, spike=spike, n_groups=ctx.groups.n_groups
  )
  return state.replace(train=next_train_state(tr, params, opt_state, finite), controller=c), info, updates


def baseline_step(
  ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule
) -> tuple[HybridState, StepInfo]:
  """The baseline's update (`real_update`) with the controller's loss statistics and health checks,
  and nothing of a predictor: the whole real step of a method that never predicts (outer momentum,
  selective backprop on the batch it chose), and the default `full_step` of every method."""
  new, info, _ = baseline_update(ctx, state, batch, schedule)
  return new, info
