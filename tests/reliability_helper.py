"""A tiny training task for the reliability tests, and a script that trains it in a subprocess.

`mlp_task` and `mlp_config` give `loop.train.train` everything it needs for the small MLP regression
problem (compiles in seconds). Every batch carries a `scale` that multiplies the loss, so a test can
inject NaN, Inf or a gradient spike at a chosen step.

As a script (`python tests/reliability_helper.py WORKDIR STEPS [STALL_STEP]`), it trains the
baseline with a checkpoint every 5 steps, prints `SAVE_STARTED <step>` after each asynchronous save
has been started, and holds the save of STALL_STEP just before orbax commits it (printing
`SAVE_STALLED <step>`), so the crash-during-save test can SIGKILL it with that save in flight.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
from conftest import STD, small_hybrid_config  # noqa: E402

from hybridjax import config as config_lib  # noqa: E402
from hybridjax import (
  preflight,
  registry,  # noqa: E402
)
from hybridjax.models import mlp  # noqa: E402

# Train-record fields that are a function of the computation alone (not of timing or memory).
DETERMINISTIC = (
  "loss",
  "predicted_loss",
  "phase",
  "confidence",
  "grad_norm",
  "horizon",
  "alpha",
  "velocity_norm",
  "phase_now",
  "predict_fraction",
  "backward_passes",
  "confidence_now",
  "accuracy",
  "agreement",
  "health_events",
  "nonfinite_events",
  "rollbacks",
  "nonfinite_streak",
)


def mlp_config(mode: str = "hybrid", steps: int = 60, **hybrid_overrides: Any) -> ml_collections.ConfigDict:
  """A complete experiment config (no model/data blocks) for `mlp_task`: quick phase cycling."""
  c = ml_collections.ConfigDict()
  c.mode = mode
  c.seed = 0
  c.resume = "auto"
  c.optim = config_lib.default_optim_config()
  c.optim.learning_rate, c.optim.warmup_steps = 1e-2, 5
  c.trainer = config_lib.default_trainer_config()
  c.trainer.update(
    dict(
      steps=steps,
      batch_size=32,
      log_every=1,
      eval_every=0,
      eval_batches=1,
      checkpoint_every=0,
      max_to_keep=100,
      progress=False,
      compile_cache=False,
    )
  )
  c.hybrid = small_hybrid_config(**{**STD, **hybrid_overrides})
  # Only the blocks the run reads are set: `train` refuses settings the run would ignore (the baseline
  # reads no hybrid setting, a method no other method's block).
  defaults = config_lib.default_hybrid_config()
  if mode == "baseline":
    c.hybrid = defaults
  for name in registry.BUILTIN_METHODS:
    key = registry.load_method(name).config_key
    if key and name != config_lib.method_name(c) and key in c.hybrid:
      c.hybrid[key] = defaults[key]
  preflight.validate(c)
  return c


def mlp_task(fault: Callable[[int], float] | None = None, *, width: int = 16) -> dict[str, Any]:
  """`loop.train.train` keyword arguments for the MLP regression problem.

  Args:
    fault: step -> factor on that step's loss (1.0 = none; nan, inf or a large factor inject a
      fault). The factor travels in the batch, so the step functions compile once.
    width: hidden width (another width makes a "foreign" checkpoint).
  """
  model = mlp.MLP(features=(width, 16), n_out=1)
  x, y = mlp.make_regression_problem(0, n_in=4)
  base_loss = mlp.make_loss_fn(model)

  def loss_fn(params, batch):
    loss, aux = base_loss(params, batch)
    return loss * batch["scale"], aux

  def train_batch(step: int) -> dict[str, np.ndarray]:
    batch = mlp.regression_batch(x, y, step=step, batch_size=32, seed=0)
    batch["scale"] = np.float32(1.0 if fault is None else fault(step))
    return batch

  def init_params(rng):
    return model.init(rng, jnp.zeros((1, 4)))["params"]

  eval_batch = {"x": x[:64], "y": y[:64], "scale": np.float32(1.0)}
  return dict(init_params=init_params, loss_fn=loss_fn, train_batch=train_batch, eval_batches=[eval_batch])


def crash_config(steps: int) -> ml_collections.ConfigDict:
  """The baseline config the crash script trains: a checkpoint and a log every 5 steps."""
  config = mlp_config("baseline", steps=steps)
  config.trainer.checkpoint_every = 5
  config.trainer.log_every = 5
  return config


def _stall_commit(step: int) -> None:
  """Makes orbax stop just before it commits the checkpoint of `step` (its data written to the
  temporary directory, not yet renamed), and announce it: the moment to SIGKILL."""
  from orbax.checkpoint._src.path import atomicity  # internal: the commit-by-rename step

  original = atomicity.AtomicRenameTemporaryPath.finalize

  async def finalize(self, *args, **kwargs):
    if self._final_path.name == str(step):
      print(f"SAVE_STALLED {step}", flush=True)
      await asyncio.sleep(120)  # the test kills us long before; never hang for ever
    return await original(self, *args, **kwargs)

  atomicity.AtomicRenameTemporaryPath.finalize = finalize


def main(argv: list[str]) -> None:
  """`WORKDIR STEPS [STALL_STEP]`: trains the baseline MLP of `crash_config(STEPS)`, printing
  `SAVE_STARTED <step>` after each asynchronous save has been started, and stalling the commit of
  STALL_STEP's checkpoint (see `_stall_commit`)."""
  from hybridjax import checkpoint as ckpt_lib
  from hybridjax.loop import train as train_lib

  workdir, steps = argv[1], int(argv[2])
  if len(argv) > 3:
    _stall_commit(int(argv[3]))
  original_save = ckpt_lib.save

  def announced_save(manager, step, state, meta):
    original_save(manager, step, state, meta)  # returns once the async write has started
    print(f"SAVE_STARTED {step}", flush=True)

  ckpt_lib.save = announced_save
  train_lib.train(crash_config(steps), workdir, **mlp_task())


if __name__ == "__main__":
  jax.config.update("jax_platforms", "cpu")
  main(sys.argv)
