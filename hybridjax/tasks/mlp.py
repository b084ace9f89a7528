"""The MLP task: regression of a fixed random teacher by a small MLP (`models.mlp`), on synthetic
data, as `loop.train.train`'s keyword arguments; the benchmark loads it as `benchmark.task='mlp'`.
Its config block is `config.mlp` (`default_task_config` when the config has none)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import ml_collections

from hybridjax.models.mlp import MLP, make_loss_fn, make_regression_problem, regression_batch

# The config blocks this task reads (`bench.tasks.reads`): its own; the GPT-2 task's model and data
# blocks are read by nothing here.
READS = ("mlp",)


def default_task_config() -> Any:
  """The `mlp` block a config needs for `build_task`: the MLP, its synthetic data and held-out split."""
  return ml_collections.ConfigDict(dict(features=(32, 32), n_in=8, n_out=1, examples=2048, eval_examples=512))


def build_task(config: Any) -> dict[str, Any]:
  """The benchmark's second built-in task (`benchmark.task='mlp'`): regression of a fixed random
  teacher by the MLP of `config.mlp` (`default_task_config`), on batches of `trainer.batch_size`
  drawn deterministically from (seed, step); the held-out split is `trainer.eval_batches` batches.
  Returns `loop.train.train`'s keyword arguments."""
  m = config.get("mlp") or default_task_config()
  model = MLP(features=tuple(m.features), n_out=int(m.n_out))
  n_train = int(m.examples)
  x, y = make_regression_problem(0, n_in=int(m.n_in), n_out=int(m.n_out), n=n_train + int(m.eval_examples))
  train_x, train_y, eval_x, eval_y = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
  batch_size, seed = int(config.trainer.batch_size), int(config.seed)
  n_eval = int(config.trainer.eval_batches)
  if n_eval * batch_size > len(eval_x):
    raise ValueError(
      f"--config.trainer.eval_batches={n_eval} batches of trainer.batch_size={batch_size} need "
      f"{n_eval * batch_size} held-out examples, but the mlp task holds mlp.eval_examples={len(eval_x)}: "
      "lower --config.trainer.eval_batches, or give the config an mlp block (default_task_config()) with "
      "more eval_examples"
    )
  return {
    "init_params": lambda rng: model.init(rng, jnp.zeros((1, int(m.n_in))))["params"],
    "loss_fn": make_loss_fn(model),
    "train_batch": lambda step: regression_batch(train_x, train_y, step, batch_size, seed),
    "eval_batches": [
      {"x": eval_x[i : i + batch_size], "y": eval_y[i : i + batch_size]}
      for i in range(0, n_eval * batch_size, batch_size)
    ],
  }
