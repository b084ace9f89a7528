"""Trajectory buffers that more than one method keeps (the velocity predictor's history, the jump
forecaster's snapshots): ring buffers of per-step feature vectors with an online normaliser, and the
window of them a dynamics model trains on."""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Normalizer:
  """Online mean/variance of the features (Welford, with the count capped so it tracks drift)."""

  mean: jax.Array  # (F,)
  var: jax.Array  # (F,)
  count: jax.Array  # f32 scalar


def init_normalizer(dim: int) -> Normalizer:
  return Normalizer(jnp.zeros((dim,), jnp.float32), jnp.ones((dim,), jnp.float32), jnp.zeros((), jnp.float32))


def update_normalizer(norm: Normalizer, x: jax.Array, max_count: float = 256.0) -> Normalizer:
  count = jnp.minimum(norm.count + 1.0, max_count)
  delta = x - norm.mean
  mean = norm.mean + delta / count
  # At count 1 the variance is undefined; keep 1 so the first normalised values are x - mean = 0.
  var = jnp.where(count > 1.0, norm.var + (delta * (x - mean) - norm.var) / count, norm.var)
  return Normalizer(mean, var, count)


def normalize(norm: Normalizer, x: jax.Array) -> jax.Array:
  """Standardised features, clipped to +-5 so one outlier cannot saturate the dynamics model."""
  return jnp.clip((x - norm.mean) * jax.lax.rsqrt(norm.var + 1e-6), -5.0, 5.0)


@flax.struct.dataclass
class History:
  """Ring buffers of the last N real steps, in write order (slot `pos` is written next)."""

  features: jax.Array  # (N, F) raw feature vectors
  logloss: jax.Array  # (N,)
  alpha_target: jax.Array  # (N, G) ideal alpha for the update after each entry
  normalizer: Normalizer
  pos: jax.Array  # int32
  count: jax.Array  # int32, saturates at N


def init_history(size: int, feature_dim: int, n_groups: int) -> History:
  return History(
    features=jnp.zeros((size, feature_dim), jnp.float32),
    logloss=jnp.zeros((size,), jnp.float32),
    alpha_target=jnp.zeros((size, n_groups), jnp.float32),
    normalizer=init_normalizer(feature_dim),
    pos=jnp.zeros((), jnp.int32),
    count=jnp.zeros((), jnp.int32),
  )


def history_window(history: History, window: int) -> dict[str, jax.Array]:
  """The last `window` entries, oldest first, normalised, with a validity mask."""
  n = history.features.shape[0]
  idx = (history.pos - window + jnp.arange(window)) % n
  valid = jnp.arange(window) >= window - jnp.minimum(history.count, window)
  x = normalize(history.normalizer, history.features[idx])
  return {
    "x": jnp.where(valid[:, None], x, 0.0),
    "logloss": history.logloss[idx],
    "alpha_target": history.alpha_target[idx],
    "valid": valid,
  }
