"""A language model's cross entropy computed a chunk of the sequence at a time (`GPT2Config.loss_chunk`).

The plain loss takes the softmax over the whole (batch, time, vocab) float32 logits: at GPT-2 Small's
vocabulary and a batch of 4 x 1024 that is 785 MiB held for the backward pass, and its gradient as
much again. Here the logits are computed from the final hidden state and the head one chunk of
positions at a time inside a `lax.scan`, each chunk under `jax.checkpoint`, so the backward pass
recomputes a chunk's logits rather than keeping them: the logits' peak memory is one chunk's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from hybridjax.models import layers


def chunked_cross_entropy(
  hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk: int, softcap: float = 0.0
) -> jax.Array:
  """The mean token cross entropy of the logits ``hidden @ head.T`` (float32; soft-capped to
  ``softcap * tanh(logits / softcap)`` when `softcap` > 0), computed `chunk` positions at a time.

  Args:
    hidden: (B, T, d) the final hidden state.
    head: (vocab, d) the output head (the tied token embedding, or an untied head transposed).
    targets: (B, T) int token ids.
    chunk: positions per chunk (> 0); a sequence that is not a multiple is padded, the padding
      weighing nothing.
    softcap: the logit soft-cap; 0 = off.

  Returns:
    The scalar float32 mean over the B * T tokens: the value of the whole-logits loss, summed in
    another order.
  """
  if chunk <= 0:
    raise ValueError(f"chunk must be positive, got {chunk}")
  b, t, d = hidden.shape
  chunk = min(chunk, t)
  n = -(-t // chunk)
  pad = n * chunk - t
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  valid = (jnp.arange(n * chunk) < t).reshape(n, 1, chunk)
  xs = hidden.reshape(b, n, chunk, d).swapaxes(0, 1)  # (n, B, chunk, d)
  ys = targets.reshape(b, n, chunk).swapaxes(0, 1)  # (n, B, chunk)

  @jax.checkpoint  # the backward pass recomputes the chunk's logits rather than storing them
  def chunk_loss(head: jax.Array, x: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
    losses = optax.softmax_cross_entropy_with_integer_labels(layers.tied_logits(x, head, softcap), y)
    return jnp.sum(jnp.where(mask, losses, 0.0))

  def body(total: jax.Array, inputs: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, None]:
    return total + chunk_loss(head, *inputs), None

  return jax.lax.scan(body, jnp.zeros((), jnp.float32), (xs, ys, valid))[0] / (b * t)
