"""Outer Nesterov momentum on K-step displacements (`optim.outer_every`): the update's equations, its
identity setting (mu = 0, eta = 1 is the baseline exactly), and its life in the baseline loop."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cached, micro_config, restore_latest
from conftest import run_experiment as _run

from hybridjax import optim, preflight


class OuterStepTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_outer_step_follows_the_equations_every_k_steps(self):
    p0 = {"w": jnp.array([1.0, -2.0]), "b": jnp.array(0.5)}
    outer = optim.init_outer_momentum(p0, every=3, eta=0.7, mu=0.9)
    step = self.variant(optim.outer_momentum_step)
    slow, m = p0, jax.tree.map(jnp.zeros_like, p0)
    params = p0
    for t in range(1, 8):
      params = jax.tree.map(lambda p: p + 0.1 * t, params)  # an inner step
      outer, got = step(outer, params, jnp.asarray(t))
      if t % 3 == 0:
        d = jax.tree.map(lambda p, s: p - s, params, slow)
        m = jax.tree.map(lambda mi, di: 0.9 * mi + di, m, d)
        slow = jax.tree.map(lambda s, di, mi: s + 0.7 * (0.9 * mi + di), slow, d, m)
        params = slow
      chex.assert_trees_all_close(got, params, rtol=1e-6)
      chex.assert_trees_all_close(outer.slow, slow, rtol=1e-6)
      chex.assert_trees_all_close(outer.momentum, m, rtol=1e-6)
      params = got

  def test_a_skipped_update_triggers_no_outer_step(self):
    p0 = {"w": jnp.array([1.0, -2.0])}
    outer = optim.init_outer_momentum(p0, every=2, eta=0.7, mu=0.9)
    moved = {"w": jnp.array([1.5, -1.0])}
    kept, params = optim.outer_momentum_step(outer, moved, jnp.asarray(2), jnp.asarray(False))
    chex.assert_trees_all_equal((kept, params), (outer, moved))
    fired, params = optim.outer_momentum_step(outer, moved, jnp.asarray(2), jnp.asarray(True))
    assert not np.allclose(np.asarray(params["w"]), np.asarray(moved["w"]))

  def test_bad_every_is_refused(self):
    with pytest.raises(ValueError, match="every"):
      optim.init_outer_momentum({"w": jnp.ones(2)}, every=0, eta=1.0, mu=0.0)


def _latest(workdir, config):
  return restore_latest(workdir, config)[1]


@pytest.mark.slow  # three GPT-2 runs compiled in a subprocess; OuterStepTest checks the update itself
@pytest.mark.cross_program
def test_identity_setting_is_the_baseline_exactly_and_a_real_setting_is_not(tmp_path, jax_cache):
  base = cached(micro_config(steps=12), jax_cache)
  base.trainer.update(averaging="ema", averaging_beta=0.9)
  _run(base, tmp_path / "base")
  ident = cached(micro_config(steps=12), jax_cache)
  ident.trainer.update(averaging="ema", averaging_beta=0.9)
  ident.optim.update(outer_every=3, outer_eta=1.0, outer_mu=0.0)
  _run(ident, tmp_path / "ident")
  a, b = _latest(tmp_path / "base", base), _latest(tmp_path / "ident", ident)
  chex.assert_trees_all_equal((a.params, a.averaging, a.opt_state), (b.params, b.averaging, b.opt_state))
  # Two params-sized buffers (slow, momentum) and three scalars, nothing else.
  size = lambda t: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(t))  # noqa: E731
  assert size(b) - size(a) == 2 * size(a.params) + 3 * 4
  real = cached(micro_config(steps=12), jax_cache)
  real.trainer.update(averaging="ema", averaging_beta=0.9)
  real.optim.update(outer_every=3, outer_eta=0.8, outer_mu=0.75)
  _run(real, tmp_path / "real")
  c = _latest(tmp_path / "real", real)
  assert not np.allclose(np.asarray(c.params["wte"]["embedding"]), np.asarray(a.params["wte"]["embedding"]))
  # Right after the last outer step (12 is a multiple of 3) the params are the slow params.
  chex.assert_trees_all_equal(c.params, c.outer.slow)


def test_outer_momentum_in_hybrid_mode_is_refused():
  c = micro_config(mode="hybrid")
  c.optim.outer_every = 10
  with pytest.raises(ValueError, match="outer_every"):
    preflight.validate(c)
