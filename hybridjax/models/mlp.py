"""A small MLP and a synthetic regression problem: the fast tests' model, and the benchmark's second
built-in task (`benchmark.task='mlp'`, `build_task`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hybridjax.optim import Batch, LossFn

Params = dict[str, Any]


class MLP(nn.Module):
  """Multi-layer perceptron with GELU hidden layers and a linear output.

  Attributes:
    features: widths of the hidden layers.
    n_out: output width.
  """

  features: Sequence[int]
  n_out: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for i, width in enumerate(self.features):
      x = nn.gelu(nn.Dense(width, name=f"dense_{i}")(x))
    return nn.Dense(self.n_out, name="out")(x)


def make_regression_problem(seed: int, n_in: int = 8, n_out: int = 1, n: int = 512) -> tuple[np.ndarray, np.ndarray]:
  """Returns float32 ``(x, y)`` of shapes (n, n_in) and (n, n_out).

  ``y`` comes from a fixed random teacher (a one-hidden-layer tanh network)
  plus a little noise; everything is determined by ``seed``.
  """
  rng = np.random.default_rng(seed)
  hidden = 32
  w1 = rng.normal(size=(n_in, hidden)) / np.sqrt(n_in)
  b1 = rng.normal(size=(hidden,)) * 0.1
  w2 = rng.normal(size=(hidden, n_out)) / np.sqrt(hidden)
  x = rng.normal(size=(n, n_in))
  y = np.tanh(x @ w1 + b1) @ w2 + 0.01 * rng.normal(size=(n, n_out))
  return x.astype(np.float32), y.astype(np.float32)


def regression_batch(x: np.ndarray, y: np.ndarray, step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
  """Samples a batch ``{'x', 'y'}`` deterministically from ``(seed, step)``.

  Within a batch examples are drawn without replacement (when
  ``batch_size <= len(x)``).
  """
  n = len(x)
  rng = np.random.default_rng([seed, step])
  idx = rng.choice(n, size=batch_size, replace=batch_size > n)
  return {"x": x[idx], "y": y[idx]}


def make_loss_fn(model: MLP) -> LossFn:
  """Returns ``loss_fn(params, batch) -> (mse, {})`` for batches ``{'x','y'}``."""

  def loss_fn(params: Params, batch: Batch):
    pred = model.apply({"params": params}, batch["x"])
    return jnp.mean(jnp.square(pred - batch["y"])), {}

  return loss_fn


def default_task_config() -> Any:
  """The `mlp` block a config needs for `build_task`: the MLP, its synthetic data and held-out split."""
  import ml_collections

  return ml_collections.ConfigDict(dict(features=(32, 32), n_in=8, n_out=1, examples=2048, eval_examples=512))


def build_task(config: Any) -> dict[str, Any]:
  """The benchmark's second built-in task (`benchmark.task='mlp'`): regression of a fixed random
  teacher by the MLP of `config.mlp` (`default_task_config`), on batches of `trainer.batch_size`
  drawn deterministically from (seed, step); the held-out split is `trainer.eval_batches` batches.
  Returns `loop.train.train`'s keyword arguments."""
  m = config.get("mlp") or default_task_config()
  model = MLP(features=tuple(m.features), n_out=int(m.n_out))
  x, y = make_regression_problem(0, n_in=int(m.n_in), n_out=int(m.n_out), n=int(m.examples) + int(m.eval_examples))
  n_train = int(m.examples)
  train_x, train_y, eval_x, eval_y = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
  batch_size, seed = int(config.trainer.batch_size), int(config.seed)
  n_eval = max(1, min(int(config.trainer.eval_batches), len(eval_x) // batch_size))
  return {
    "init_params": lambda rng: model.init(rng, jnp.zeros((1, int(m.n_in))))["params"],
    "loss_fn": make_loss_fn(model),
    "train_batch": lambda step: regression_batch(train_x, train_y, step, batch_size, seed),
    "eval_batches": [
      {"x": eval_x[i * batch_size : (i + 1) * batch_size], "y": eval_y[i * batch_size : (i + 1) * batch_size]}
      for i in range(n_eval)
    ],
  }
