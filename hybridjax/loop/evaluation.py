"""Evaluation on fixed held-out batches: the jitted loss, per batch, and a train state's eval record."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from hybridjax import sharding as sharding_lib
from hybridjax.optim import Batch, LossFn, TrainState, raw_params

EvalFn = Callable[[Any, Batch], jax.Array]  # (params, batch) -> loss


def make_eval_fn(loss_fn: LossFn, mesh: jax.sharding.Mesh | None = None) -> EvalFn:
  """The jitted loss. On a multi-device `mesh` it takes the sharded params and batch as they are
  and returns the loss replicated, so every host can read it."""
  kw = {"out_shardings": sharding_lib.replicated(mesh)} if sharding_lib.is_multi_device(mesh) else {}
  return jax.jit(lambda params, batch: loss_fn(params, batch)[0], **kw)


def eval_losses(eval_fn: EvalFn, params: Any, batches: Iterable[Batch]) -> np.ndarray:
  """The loss of each fixed eval batch (float32), fetched in one transfer."""
  return np.asarray(jax.device_get([eval_fn(params, b) for b in batches]))


def evaluate(eval_fn: EvalFn, params: Any, batches: Iterable[Batch]) -> float:
  """Mean loss over fixed eval batches (every run sees the same ones)."""
  return float(np.mean(eval_losses(eval_fn, params, batches)))


def evaluate_state(eval_fn: EvalFn, state: TrainState, batches: list[Batch]) -> dict:
  """The eval record of a train state: `eval_loss` of the run's model (`optim.final_params`) and,
  when the state averages its params, `eval_loss_raw` and `eval_loss_averaged` too."""
  raw = evaluate(eval_fn, raw_params(state), batches)
  if state.averaging is None:
    return {"eval_loss": raw}
  averaged = evaluate(eval_fn, state.averaging.params, batches)
  return {"eval_loss": averaged, "eval_loss_raw": raw, "eval_loss_averaged": averaged}
