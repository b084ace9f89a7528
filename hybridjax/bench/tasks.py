"""Benchmark tasks as plug-ins, loaded by name or module path (`config.benchmark.task`), as AlgoPerf
loads a workload and benchopt a dataset.

A task is a module with `build_task(config) -> task`, where `task` gives the keyword arguments of
`loop.train.train`: `init_params`, `loss_fn`, `train_batch`, `eval_batches`, and optionally `tx` (an
optimizer of the task's own: an optax transformation with an injected learning rate, or a factory
`learning_rate -> tx`), `tokens_per_step`, `extra_meta`; either through `train_kwargs()` or as a
mapping. Its `loss_fn` may depend on the model's config, not on the seed: the anchors compile one
step per model and optimizer and reuse it across seeds and learning rates. A task that gives `tx`
names it with a module constant `OPTIMIZER` (e.g. 'my_adamw'): every run's `optim.name` becomes it,
so the name is in the run's config record and its cache key, and both the anchors and the method
arms train with that optimizer. A task may also define
`benchmark_notes(config, budget_steps)` (what a report says of its data per budget), and declares the
config blocks it reads beside the trainer's and the optimizer's with a module constant `READS` (e.g.
`READS = ("data", "model")`; none when it has no `READS`): a field of a block some task reads (the
GPT-2 task's `model` and `data`, the MLP's `mlp`) that this task does not read is refused when set,
rather than recorded in every run's config and cache key and never read. A task's batches
must depend on `config.seed` (each headline seed its own data, so that a result's '± se' measures
more than the initialisation): the benchmark builds a task of the user's under two seeds and refuses
one whose first batch is the same (`specs.check_task_seeds`), unless the module declares
`SEED_INDEPENDENT_DATA = True` (a task that means it; the record says so).

Built-in: 'gpt2' (a GPT-2 on a corpus, byte or BPE, `hybridjax.tasks.gpt2`) and 'mlp' (a
regression MLP on synthetic data, `hybridjax.tasks.mlp`). They live in the package, below the loop,
rather than in `experiments/` (which `experiments.gpt2_small` merely runs): the library needs no
module of the layer above it, and an anchor's cache key, the source its task imports, holds no
training program (`experiments.gpt2_small` imports `train()` and with it the hybrid algorithm, so an
anchor keyed on it would retrain at every method edit). Any other name is a dotted module path:
`--config.benchmark.task=my_pkg.my_task`.
"""

from __future__ import annotations

import types
from typing import Any

import ml_collections

from hybridjax import registry

BUILTIN_TASKS = {"gpt2": "hybridjax.tasks.gpt2", "mlp": "hybridjax.tasks.mlp"}


def task_path(name: str) -> str:
  """The module path of task `name`: a built-in's, or `name` itself (a user's dotted path)."""
  return BUILTIN_TASKS.get(name, name)


def load_task(name: str) -> types.ModuleType:
  """The task module `name`; errors name `benchmark.task` and the fix."""
  module = registry.load_plugin(name, BUILTIN_TASKS, "--config.benchmark.task", "task")
  if not callable(getattr(module, "build_task", None)):
    raise ValueError(f"--config.benchmark.task={name!r} ({module.__name__}) defines no build_task(config)")
  return module


def optimizer_name(name: str) -> str | None:
  """The name of task `name`'s own optimizer (its `OPTIMIZER`), or None when it uses `config.optim`'s."""
  value = getattr(load_task(name), "OPTIMIZER", None)
  return None if value is None else str(value)


def seed_independent(name: str) -> bool:
  """Whether task `name` declares that its batches do not depend on `config.seed` (`SEED_INDEPENDENT_DATA`)."""
  return bool(getattr(load_task(name), "SEED_INDEPENDENT_DATA", False))


def train_kwargs(task: Any) -> dict[str, Any]:
  """The keyword arguments of `loop.train.train` a built task gives."""
  return dict(task.train_kwargs() if hasattr(task, "train_kwargs") else task)


def build(name: str, config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The task `name` built for `config`, as `train()`'s keyword arguments."""
  return train_kwargs(load_task(name).build_task(config))


def reads(name: str) -> tuple[str, ...]:
  """The config blocks task `name` reads beside the trainer's and the optimizer's (its `READS`)."""
  return tuple(getattr(load_task(name), "READS", ()))


def unread_block_errors(name: str, flat: dict[str, Any], given: set[str]) -> list[str]:
  """A line for each field of `given` (dotted; `flat`: the config flattened) in a block the task
  `name` does not read (its `READS`), and for `data.path` set at all there (no preset gives a corpus):
  every run would record it, in its key too, and never read it. A task that does not load: none
  (the benchmark's checks name it)."""
  try:
    task_reads = reads(name)
  except ValueError:
    return []
  # the blocks some built-in task reads and this one does not
  unread = [b for b in dict.fromkeys(b for n in BUILTIN_TASKS for b in reads(n)) if b not in task_reads]
  if "data" in unread and flat.get("data.path"):
    given = given | {"data.path"}
  blocks = " and ".join(f"its {b}" for b in task_reads) if task_reads else "no block of a task's"
  return [
    f"--config.{field}={flat.get(field)!r} is set but unused: --config.benchmark.task={name!r} reads "
    f"{blocks} (its READS), not the {field.split('.')[0]} block, so every run would record it and never read "
    "it. Set the fields the task reads, declare READS in the task's module if it does read this block "
    "(docs/benchmark.md), or use --config.benchmark.task=gpt2"
    for field in sorted(given)
    if field.split(".")[0] in unread
  ]
