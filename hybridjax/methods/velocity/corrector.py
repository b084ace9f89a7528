"""The residual corrector: learns where the dynamics model's predictions go wrong.

Input: the normalised features at the start of a PREDICT phase and the position k/H_max in the
horizon. Output: a correction to the predicted log-loss and a log-scale for the predicted alpha:

  logloss_hat_k  <-  logloss_hat_k + delta_k
  alpha_k        <-  alpha_k * exp(s_k)

It is trained on the residuals that validation observes (a predicted log-loss against the measured
one) and on the realised improvement against the predicted one, kept in a small ring buffer, one
Adam step per observed residual. Its output layer starts at zero, so an untrained corrector changes
nothing.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from hybridjax.optim import tree_where

# The scale correction is bounded: it can shrink alpha 20x or grow it 1.65x, never flip its sign.
LOG_SCALE_MIN, LOG_SCALE_MAX = -3.0, 0.5


class CorrectorMLP(nn.Module):
  hidden: int = 64

  @nn.compact
  def __call__(self, x: jax.Array, pos: jax.Array) -> tuple[jax.Array, jax.Array]:
    h = jnp.concatenate([x, pos[..., None]], axis=-1)
    h = nn.silu(nn.LayerNorm()(nn.Dense(self.hidden)(h)))
    h = nn.silu(nn.Dense(self.hidden)(h))
    out = nn.Dense(2, kernel_init=nn.initializers.zeros, bias_init=nn.initializers.zeros)(h)
    delta = out[..., 0]
    log_scale = jnp.clip(out[..., 1], LOG_SCALE_MIN, LOG_SCALE_MAX)
    return delta, log_scale


@flax.struct.dataclass
class CorrectorState:
  params: Any
  opt_state: Any
  # Ring buffer of observed residuals.
  x: jax.Array  # (C, F) normalised features at the phase start
  pos: jax.Array  # (C,) k / H_max
  target_delta: jax.Array  # (C,) measured minus model-predicted log-loss
  target_log_scale: jax.Array  # (C,) the alpha log-scale that would have matched the measurement
  valid: jax.Array  # (C,) bool
  write: jax.Array  # int32: next slot
  updates: jax.Array  # int32: training steps taken


def make_optimizer(learning_rate: float) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate))


def init_corrector(
  rng: jax.Array, feature_dim: int, capacity: int, hidden: int, learning_rate: float
) -> CorrectorState:
  model = CorrectorMLP(hidden)
  params = model.init(rng, jnp.zeros((feature_dim,)), jnp.zeros(()))["params"]
  zeros = lambda dtype=jnp.float32, shape=(capacity,): jnp.zeros(shape, dtype)  # a buffer of its own each
  return CorrectorState(
    params=params,
    opt_state=make_optimizer(learning_rate).init(params),
    x=jnp.zeros((capacity, feature_dim), jnp.float32),
    pos=zeros(),
    target_delta=zeros(),
    target_log_scale=zeros(),
    valid=zeros(bool),
    write=zeros(jnp.int32, ()),
    updates=zeros(jnp.int32, ()),
  )


def apply_corrector(state: CorrectorState, x: jax.Array, pos: jax.Array, hidden: int) -> tuple[jax.Array, jax.Array]:
  """(delta, log_scale) for features x (F,) at horizon positions pos (H,)."""
  model = CorrectorMLP(hidden)
  return jax.vmap(lambda p: model.apply({"params": state.params}, x, p))(pos)


def add_residual(
  state: CorrectorState,
  x: jax.Array,
  pos: jax.Array,
  target_delta: jax.Array,
  target_log_scale: jax.Array,
  enabled: jax.Array,
) -> CorrectorState:
  """Appends one observation when `enabled` (a traced bool); otherwise returns the state as is."""
  i = state.write
  cap = state.valid.shape[0]

  def put(buf, v):
    return jnp.where(enabled, buf.at[i].set(v), buf)

  return state.replace(
    x=put(state.x, x),
    pos=put(state.pos, pos),
    target_delta=put(state.target_delta, target_delta),
    target_log_scale=put(state.target_log_scale, jnp.clip(target_log_scale, LOG_SCALE_MIN, LOG_SCALE_MAX)),
    valid=put(state.valid, True),
    write=jnp.where(enabled, (i + 1) % cap, i),
  )


def corrector_loss(params: Any, state: CorrectorState, hidden: int) -> jax.Array:
  model = CorrectorMLP(hidden)
  delta, log_scale = jax.vmap(lambda x, p: model.apply({"params": params}, x, p))(state.x, state.pos)
  w = state.valid.astype(jnp.float32)
  err = jnp.square((delta - state.target_delta) / 0.01) + jnp.square(log_scale - state.target_log_scale)
  return jnp.sum(w * err) / jnp.maximum(jnp.sum(w), 1.0)


def train_corrector(
  state: CorrectorState, hidden: int, learning_rate: float, enabled: jax.Array
) -> tuple[CorrectorState, jax.Array]:
  """One Adam step on the buffer when `enabled`; returns (state, loss)."""
  loss, grads = jax.value_and_grad(corrector_loss)(state.params, state, hidden)
  updates, opt_state = make_optimizer(learning_rate).update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return state.replace(
    params=tree_where(enabled, params, state.params),
    opt_state=tree_where(enabled, opt_state, state.opt_state),
    updates=state.updates + enabled.astype(jnp.int32),
  ), loss
