"""hybridjax: train Flax models with fewer backward passes, and measure whether it pays.

Training alternates real optimizer steps with predicted steps, theta += sum_g alpha_g velocity_g,
planned by an online-trained RSSM of the training trajectory. The layers, each importing only those
below it:

  hybridjax.optim     the optimizer layer: TrainState, the runtime LR schedule, the baseline step
  hybridjax.hybrid    the framework: the controller, the state, the shared real step, the fused hybrid_step
  hybridjax.methods   the training methods as plug-ins (velocity, jump, ...), loaded by name
  hybridjax.loop      the host loop: drivers (baseline, hybrid) and train()

The package root is the public entry point, re-exporting (on first use, so that importing a
submodule stays cheap):

  hybridjax.default_config(mode)   a complete config for a task of your own
  hybridjax.train(config, workdir, *, init_params, loss_fn, train_batch, eval_batches, tx=None)
  hybridjax.export_params(workdir, *, step=None, averaged=True)

The experiment is `experiments/gpt2_small.py`; the algorithm is described in docs/design.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it: the public API, imported when first used.
_PUBLIC = {
  "default_config": "hybridjax.config",
  "train": "hybridjax.loop.train",
  "export_params": "hybridjax.checkpoint",
  "TrainingDiverged": "hybridjax.loop.train",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
  if name not in _PUBLIC:
    raise AttributeError(f"module 'hybridjax' has no attribute {name!r}")
  return getattr(importlib.import_module(_PUBLIC[name]), name)
