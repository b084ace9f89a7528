"""Layers the models share, shaped for fast XLA:CPU programs.

`Dense` is `flax.linen.Dense` (the same parameters, names and initialisers, so checkpoints and the
Hugging Face converter are unchanged) applied to its input flattened to 2-D, (batch * time, features),
and reshaped back. The forward pass computes the same products; the backward pass is where it
matters: for a 3-D input, XLA:CPU computes the weight gradient (which contracts the batch and time
dimensions) as a plain `dot` after a transpose copy, about twice as slow as the library kernel a 2-D
gradient gets (docs/performance.md has the figures). On GPU both go to cuBLAS.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn


class Dense(nn.Dense):
  """`nn.Dense` on the input flattened to (-1, features): same parameters, same result."""

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    y = super().__call__(inputs.reshape(-1, inputs.shape[-1]))
    return y.reshape(*inputs.shape[:-1], y.shape[-1])


def tied_logits(x: jax.Array, embedding: jax.Array, softcap: float = 0.0) -> jax.Array:
  """`x @ embedding.T` for x of shape (..., d) and a (vocab, d) embedding, in float32, computed on
  the flattened (-1, d) rows (the embedding's gradient then contracts one dimension, not two); with
  `softcap` > 0 soft-capped to ``softcap * tanh(logits / softcap)``."""
  logits = jnp.dot(x.reshape(-1, x.shape[-1]), embedding.T, preferred_element_type=jnp.float32)
  logits = logits.reshape(*x.shape[:-1], embedding.shape[0])
  return softcap * jnp.tanh(logits / softcap) if softcap else logits
