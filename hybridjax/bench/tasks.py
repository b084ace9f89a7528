"""Benchmark tasks as plug-ins, loaded by name or module path (`config.benchmark.task`).

A task is a module with `build_task(config) -> task`, where `task` has the keyword arguments of
`loop.train.train`: `init_params`, `loss_fn`, `train_batch`, `eval_batches` (and optionally `tx`, an
optimizer of the task's own, `tokens_per_step`, `extra_meta`), and `train_kwargs()` returning them
(a `dict`-like namespace works too). Built-in: 'gpt2' (the GPT-2 on a corpus, byte or BPE,
`experiments.gpt2_small`) and 'mlp' (a regression MLP on synthetic data, `hybridjax.models.mlp`).
Any other name is a dotted module path: `--config.benchmark.task=my_pkg.my_task`.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import ml_collections

BUILTIN_TASKS = {"gpt2": "experiments.gpt2_small", "mlp": "hybridjax.models.mlp"}


def task_path(name: str) -> str:
  return BUILTIN_TASKS.get(name, name)


def load_task(name: str) -> types.ModuleType:
  """The task module `name`; errors name `benchmark.task` and the fix."""
  try:
    module = importlib.import_module(task_path(name))
  except ModuleNotFoundError as e:
    raise ValueError(
      f"--config.benchmark.task={name!r} names no task: use {' or '.join(map(repr, BUILTIN_TASKS))}, or the dotted "
      "path of an importable module with build_task(config)"
    ) from e
  if not callable(getattr(module, "build_task", None)):
    raise ValueError(f"--config.benchmark.task={name!r} ({module.__name__}) defines no build_task(config)")
  return module


def train_kwargs(task: Any) -> dict[str, Any]:
  """The keyword arguments of `loop.train.train` a built task gives."""
  if hasattr(task, "train_kwargs"):
    return dict(task.train_kwargs())
  return dict(task)


def build(name: str, config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The task `name` built for `config`, as `train()`'s keyword arguments."""
  return train_kwargs(load_task(name).build_task(config))
