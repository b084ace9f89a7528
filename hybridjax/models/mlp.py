"""A small MLP and a synthetic regression problem: the fast tests' model, and the model of the
benchmark's second built-in task (`hybridjax.tasks.mlp`)."""

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
  return x.astype(np.float32), (np.tanh(x @ w1 + b1) @ w2 + 0.01 * rng.normal(size=(n, n_out))).astype(np.float32)


def regression_batch(x: np.ndarray, y: np.ndarray, step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
  """Samples a batch ``{'x', 'y'}`` deterministically from ``(seed, step)``.

  Within a batch examples are drawn without replacement (when
  ``batch_size <= len(x)``).
  """
  idx = np.random.default_rng([seed, step]).choice(len(x), size=batch_size, replace=batch_size > len(x))
  return {"x": x[idx], "y": y[idx]}


def make_loss_fn(model: MLP) -> LossFn:
  """Returns ``loss_fn(params, batch) -> (mse, {})`` for batches ``{'x','y'}``."""

  def loss_fn(params: Params, batch: Batch):
    return jnp.mean(jnp.square(model.apply({"params": params}, batch["x"]) - batch["y"])), {}

  return loss_fn
