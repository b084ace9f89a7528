"""A method whose predicted steps turn non-finite on demand, for tests/hybrid/test_nonfinite_prediction.py.

Its real step is the baseline's, after which it is always confident (so PREDICT comes as soon as the
controller allows it). Its predicted step adds `MOVE` to every param and 1 to its own counter, and
the batch says what to poison (`batch["poison"]`, so that one compiled program serves every test):
`PARAMS` makes the move NaN, `STATE` its counter (the params stay finite), `NONE` nothing. It rolls
nothing back: the framework alone must keep a non-finite move out of the state.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.real_step import baseline_step
from hybridjax.hybrid.state import HybridState
from hybridjax.optim import Batch, Schedule, moved_train_state

NAME = "nan_predictor"
MOVE = 1e-3
NONE, PARAMS, STATE = 0, 1, 2  # batch["poison"]


@flax.struct.dataclass
class NanState:
  predicted: jax.Array  # int32: predicted steps kept
  counter: jax.Array  # float32: +1 per predicted step (NaN in a step poisoned with STATE)


def make_settings(hybrid: Any, *, groups: Any) -> None:
  del hybrid, groups


def init(ctx: HybridContext, params: Any, rng: jax.Array) -> NanState:
  del ctx, params, rng
  return NanState(predicted=jnp.zeros((), jnp.int32), counter=jnp.zeros((), jnp.float32))


def full_step(ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule) -> tuple[HybridState, StepInfo]:
  state, info = baseline_step(ctx, state, batch, schedule)
  return state.replace(controller=state.controller.replace(confidence=jnp.float32(1.0))), info


def predict_step(
  ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule
) -> tuple[HybridState, StepInfo]:
  del schedule
  m: NanState = state.method
  poison = batch["poison"]
  move = MOVE + jnp.where(poison == PARAMS, jnp.nan, 0.0)
  params = jax.tree.map(lambda p: p + move, state.train.params)
  counter = m.counter + jnp.where(poison == STATE, jnp.nan, 1.0)
  info = StepInfo.predicted(alpha=jnp.full((ctx.groups.n_groups,), MOVE), forwards=0)
  new = state.replace(
    train=moved_train_state(state.train, params), method=NanState(predicted=m.predicted + 1, counter=counter)
  )
  return new, info
