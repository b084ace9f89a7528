"""The velocity predictor's training-state feature vector x_t (docs/design.md, "Features"): global
features, the phase, and 4 per parameter group."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybridjax.hybrid.groups import ParamGroups, safe_log
from hybridjax.hybrid.phases import PHASE_NAMES

N_PHASES = len(PHASE_NAMES)
# Global (non-per-group) features, in order. Per-group features follow, 4 per group.
GLOBAL_FEATURES = ("loss", "log_loss", "ema_fast", "ema_slow", "log_grad_norm", "log_lr", "progress") + tuple(
  f"phase_{p.lower()}" for p in PHASE_NAMES
)
GROUP_FEATURES = ("log_grad_norm", "log_update_norm", "log_param_norm", "cos_update_velocity")
_EPS = 1e-12


def feature_dim(groups: ParamGroups) -> int:
  """The length of x_t for `groups`."""
  return len(GLOBAL_FEATURES) + len(GROUP_FEATURES) * groups.n_groups


def feature_vector(
  *,
  loss: jax.Array,
  ema_fast: jax.Array,
  ema_slow: jax.Array,
  grad_norm: jax.Array,
  lr: jax.Array,
  progress: jax.Array,
  phase: jax.Array,
  grad_sq: jax.Array,
  update_sq: jax.Array,
  param_sq: jax.Array,
  update_velocity_dot: jax.Array,
  velocity_sq: jax.Array,
) -> jax.Array:
  """Assembles x_t (see GLOBAL_FEATURES and GROUP_FEATURES). Per-group inputs have shape (G,)."""
  log_loss = safe_log(loss)
  phase_onehot = jax.nn.one_hot(phase, N_PHASES, dtype=jnp.float32)
  cos = update_velocity_dot * jax.lax.rsqrt(jnp.maximum(update_sq * velocity_sq, _EPS))
  glob = jnp.stack([loss, log_loss, ema_fast, ema_slow, safe_log(grad_norm), safe_log(lr), progress]).astype(
    jnp.float32
  )
  per_group = jnp.concatenate([0.5 * safe_log(grad_sq), 0.5 * safe_log(update_sq), 0.5 * safe_log(param_sq), cos])
  x = jnp.concatenate([glob, phase_onehot, per_group.astype(jnp.float32)])
  return jnp.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
