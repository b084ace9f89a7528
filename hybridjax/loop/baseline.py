"""The baseline loop: the plain optax loop with the step `train()` runs in baseline mode, for code
that needs the run's raw numbers rather than a workdir (the benchmark's anchors, the diagnostic
scripts, the tests).

`make_train_step` is the one jitted, donating baseline step: `loop.drivers.BaselineDriver` jits it
so, and so does `run`, so a run here computes the bits `train()` computes (tests/bench/test_benchmark.py
checks it). Beside the train state's own average, `run` keeps side averages of the params at other
betas (the benchmark's tuning picks the averaging beta from them, the jump diagnostics their slow
EMA), evaluates at fixed intervals or given steps, and calls a diagnostic's hook after each step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import jax
import numpy as np
import optax

from hybridjax import optim as optim_lib
from hybridjax import sharding as sharding_lib
from hybridjax.loop.evaluation import EvalFn, eval_losses, make_eval_fn
from hybridjax.optim import Batch, LossFn, Schedule, TrainState

StepFn = Callable[[TrainState, Batch, Schedule], tuple[TrainState, dict[str, jax.Array]]]


def make_train_step(
  loss_fn: LossFn,
  tx: optax.GradientTransformation,
  grad_accum: int = 1,
  state_shardings: Any = None,
  mesh: Any = None,
) -> StepFn:
  """`optim.train_step` jitted with the state donated: the baseline's one step program."""

  def step(state, batch, schedule):
    return optim_lib.train_step(state, batch, schedule, loss_fn=loss_fn, tx=tx, grad_accum=grad_accum)

  # keep_unused: every input leaf must be donated, whether or not the step reads it.
  return jax.jit(step, donate_argnums=0, keep_unused=True, **sharding_lib.step_jit_kwargs(state_shardings, mesh))


def _update_averages(averages, params, count):
  return [optim_lib.update_average(a, params, count) for a in averages]


_average_step = jax.jit(_update_averages, donate_argnums=0)


def finite_or_inf(value: float) -> float:
  """`value`, or inf when it is not finite (a diverged run loses every ranking)."""
  return value if math.isfinite(value) else math.inf


def run(
  state: TrainState,
  step: StepFn,
  *,
  train_batch: Callable[[int], Batch],
  eval_batches: Sequence[Batch],
  eval_fn: EvalFn | None,
  schedule: Schedule,
  steps: int,
  eval_every: int = 0,
  eval_steps: Collection[int] = (),
  side_betas: Sequence[float] = (),
  on_step: Callable[[int, TrainState, list[optim_lib.Averaging]], None] | None = None,
) -> dict[str, Any]:
  """Trains `state` for `steps` steps of `step` (which donates it), evaluating every `eval_every`
  steps (0: no periodic eval), at each step in `eval_steps` and at the end (never when `eval_fn` is
  None); keeps the params' average at each of `side_betas` beside the state's own.

  `on_step(done, state, side)`, when given, is called after each step and its eval, with the side
  averages (`optim.Averaging`, in `side_betas`' order): a diagnostic's hook (snapshots, a move
  tried from a copy). Both are donated to the next step: it may read them or copy them to the
  host, never keep them. Its time counts as training time.

  Returns a dict: `state`; `side`, the side averages; `curve`, one point per eval ({step,
  eval_loss_raw, eval_loss_averaged}: the raw params and the state's own average); `final_raw`;
  `final_averaged_per_batch` (each eval batch's loss of the final averaged params); `side_averaged`
  (beta -> final loss of that side average); `compile_s` (the first step's) and `train_s` (the steps
  alone, no evals). Without `eval_fn`, no curve and no final losses.
  """
  side = [
    optim_lib.Averaging(params=jax.tree.map(lambda p: p.copy(), state.params), beta=jax.numpy.float32(b))
    for b in side_betas
  ]
  eval_steps = frozenset(int(t) for t in eval_steps)
  curve, compile_s, train_s = [], 0.0, 0.0
  out: dict[str, Any] = {}
  t0 = time.perf_counter()
  for i in range(steps):
    state, _ = step(state, train_batch(i), schedule)
    if side:
      side = _average_step(side, optim_lib.raw_params(state), i + 1)
    if i == 0:  # the first step compiles
      jax.block_until_ready((state, side))
      compile_s, t0 = time.perf_counter() - t0, time.perf_counter()
    done = i + 1
    if eval_fn is not None and ((eval_every and done % eval_every == 0) or done in eval_steps or done == steps):
      jax.block_until_ready((state, side))
      train_s += time.perf_counter() - t0  # training time between evals; evals are not counted
      raw = finite_or_inf(float(np.mean(eval_losses(eval_fn, optim_lib.raw_params(state), eval_batches))))
      averaged = eval_losses(eval_fn, state.averaging.params, eval_batches) if state.averaging is not None else None
      curve.append(
        {
          "step": done,
          "eval_loss_raw": raw,
          "eval_loss_averaged": raw if averaged is None else finite_or_inf(float(np.mean(averaged))),
        }
      )
      if done == steps:
        out["final_raw"] = raw
        out["final_averaged_per_batch"] = [float(x) for x in (averaged if averaged is not None else [])]
        out["side_averaged"] = {
          float(b): finite_or_inf(float(np.mean(eval_losses(eval_fn, a.params, eval_batches))))
          for b, a in zip(side_betas, side)
        }
      t0 = time.perf_counter()
    if on_step is not None:
      on_step(done, state, side)
  if eval_fn is None or steps == 0:
    jax.block_until_ready((state, side))
    train_s += time.perf_counter() - t0
  out.update(state=state, side=side, curve=curve, compile_s=compile_s, train_s=train_s)
  return out


__all__ = ["make_train_step", "run", "finite_or_inf", "make_eval_fn"]
