"""Parameter groups and per-group arithmetic (hybridjax.methods.velocity.features)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid import trajectory as trajectory_lib
from hybridjax.hybrid.phases import PHASE_NAMES
from hybridjax.methods.velocity import features as features_lib


def test_param_groups_by_kind():
  from hybridjax.models import gpt2

  cfg = gpt2.PRESETS["tiny"]
  shapes = jax.eval_shape(lambda: gpt2.GPT2(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
  g = groups_lib.param_groups(shapes, "kind")
  assert g.n_groups == 16  # wte, wpe, ln_f (2), and 12 per-block kinds shared by both blocks
  assert "h_*/attn/c_attn/kernel" in g.names
  assert groups_lib.param_groups(shapes, "leaf").n_groups == len(jax.tree.leaves(shapes))
  assert groups_lib.param_groups(shapes, "global").n_groups == 1
  assert features_lib.feature_dim(g) == len(features_lib.GLOBAL_FEATURES) + 4 * 16
  assert len(features_lib.GLOBAL_FEATURES) == 7 + len(PHASE_NAMES)


def test_group_sums_and_scaled_steps():
  params = {"h_0": {"w": jnp.full((2, 2), 1.0)}, "h_1": {"w": jnp.full((2, 2), 2.0)}, "out": jnp.full((3,), 3.0)}
  g = groups_lib.param_groups(params, "kind")
  assert g.n_groups == 2
  np.testing.assert_allclose(groups_lib.group_sq_norms(g, params), [4 * 1.0 + 4 * 4.0, 3 * 9.0])
  ones = jax.tree.map(jnp.ones_like, params)
  np.testing.assert_allclose(groups_lib.group_dots(g, params, ones), [4 + 8, 9])
  moved = groups_lib.add_scaled_by_group(g, params, jnp.asarray([0.5, -1.0]), ones)
  chex.assert_trees_all_close(
    moved, {"h_0": {"w": jnp.full((2, 2), 1.5)}, "h_1": {"w": jnp.full((2, 2), 2.5)}, "out": jnp.full((3,), 2.0)}
  )
  back = groups_lib.add_scaled_by_group(g, moved, jnp.asarray([-0.5, 1.0]), ones)
  chex.assert_trees_all_equal(back, params)


def test_feature_vector_is_finite_and_normalised():
  g = 3
  x = features_lib.feature_vector(
    loss=jnp.float32(2.0),
    ema_fast=jnp.float32(2.1),
    ema_slow=jnp.float32(2.5),
    grad_norm=jnp.float32(0.0),
    lr=jnp.float32(0.0),
    progress=jnp.float32(0.5),
    phase=jnp.int32(2),
    grad_sq=jnp.zeros(g),
    update_sq=jnp.ones(g),
    param_sq=jnp.ones(g),
    update_velocity_dot=jnp.zeros(g),
    velocity_sq=jnp.zeros(g),
  )
  chex.assert_shape(x, (len(features_lib.GLOBAL_FEATURES) + 4 * g,))
  assert np.all(np.isfinite(x))
  assert x[7 + 2] == 1.0 and x[7 : 7 + len(PHASE_NAMES)].sum() == 1.0  # the one-hot phase
  norm = trajectory_lib.init_normalizer(x.shape[0])
  for _ in range(3):
    norm = trajectory_lib.update_normalizer(norm, x)
  assert np.all(np.abs(trajectory_lib.normalize(norm, x * 1e6)) <= 5.0)
