"""Per-sequence selective backprop (`hybrid.method='selective_backprop'`): the selection, one step
against the baseline's update on the chosen half, the loop's two batches per step, and a whole run
with its costs as performed."""

from __future__ import annotations

import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reliability_helper as rh
from conftest import small_hybrid_config

from hybridjax import optim, registry, writers
from hybridjax.hybrid import real_step as real_step_lib
from hybridjax.hybrid import step as step_lib
from hybridjax.loop import drivers
from hybridjax.loop import train as train_lib
from hybridjax.methods import selective_backprop as sb


class SelectTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_the_top_selection_keeps_the_highest_losses(self):
    scores = jnp.array([0.1, 3.0, 2.0, -1.0, 5.0, 0.0])
    index = self.variant(lambda s: sb.select(s, 3, jax.random.PRNGKey(0), False))(scores)
    chex.assert_shape(index, (3,))
    assert sorted(np.asarray(index).tolist()) == [1, 2, 4]

  @chex.variants(with_jit=True, without_jit=True)
  def test_the_random_selection_draws_distinct_indices_that_vary_with_the_key(self):
    scores = jnp.arange(16.0)
    pick = self.variant(lambda k: sb.select(scores, 8, k, True))
    draws = [np.asarray(pick(jax.random.PRNGKey(i))) for i in range(4)]
    for d in draws:
      chex.assert_shape(d, (8,))
      assert len(set(d.tolist())) == 8 and d.min() >= 0 and d.max() < 16
    assert len({tuple(sorted(d.tolist())) for d in draws}) > 1  # not the same half every time
    assert any(sorted(d.tolist()) != list(range(8, 16)) for d in draws)  # not the top half


def _context(random: bool):
  h = small_hybrid_config()
  h.method = "selective_backprop"
  h.selective = registry.load_method("selective_backprop").default_config()
  h.selective.random = random
  params = rh_params()
  tx = optim.make_optimizer(rh.mlp_config().optim)
  task = rh.mlp_task()
  ctx = drivers.make_context(h, loss_fn=task["loss_fn"], tx=tx, params_shape=params, total_steps=40)
  return ctx, task, params


def rh_params():
  task = rh.mlp_task()
  return jax.device_get(task["init_params"](jax.random.PRNGKey(0)))


class SelectiveStepTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_a_step_is_the_baselines_update_on_the_B_highest_loss_examples(self):
    ctx, task, params = _context(random=False)
    state = step_lib.init_hybrid_state(ctx, jax.tree.map(jnp.asarray, params), jax.random.PRNGKey(0))
    batch = train_lib.step_batches(rh.mlp_config(**method_config()), task["train_batch"])(3)
    n = batch["x"].shape[0]
    chex.assert_shape(batch["x"], (2 * task["train_batch"](0)["x"].shape[0], 4))
    schedule = optim.make_schedule(rh.mlp_config().optim, 40)
    new, info = self.variant(lambda s, b: sb.full_step(ctx, s, b, schedule))(state, batch)
    # The reference: each example's loss alone, the top half by a host sort, the baseline's real step.
    one = jax.jit(lambda p, b: task["loss_fn"](p, b)[0])  # one example at a time, compiled once
    losses = np.array(
      [float(one(params, jax.tree.map(lambda x: x[i : i + 1] if np.ndim(x) else x, batch))) for i in range(n)]
    )
    top = np.sort(np.argsort(-losses)[: n // 2])
    chosen = jax.tree.map(lambda x: x[top] if np.ndim(x) else x, batch)
    expected, _ = real_step_lib.baseline_step(ctx, state, chosen, schedule)
    chex.assert_trees_all_close(new.train.params, expected.train.params, rtol=1e-5, atol=1e-6)
    assert bool(info.was_real) and int(info.forwards) == 2
    chex.assert_trees_all_close(info.extra["scored_loss"], losses.mean(), rtol=1e-4)
    chex.assert_trees_all_close(info.extra["selected_loss"], losses[top].mean(), rtol=1e-4)


def method_config():
  return {"method": "selective_backprop"}


def test_a_step_receives_two_consecutive_batches_and_other_methods_one():
  task = rh.mlp_task()
  sel = train_lib.step_batches(rh.mlp_config(**method_config()), task["train_batch"])
  one = train_lib.step_batches(rh.mlp_config(), task["train_batch"])
  for i in (0, 5):
    both = [task["train_batch"](2 * i), task["train_batch"](2 * i + 1)]
    got = sel(i)
    chex.assert_trees_all_equal(got["x"], np.concatenate([b["x"] for b in both]))
    chex.assert_trees_all_equal(got["scale"], both[0]["scale"])  # a leaf with no batch axis is shared
    chex.assert_trees_all_equal(one(i), task["train_batch"](i))


def test_a_method_that_declares_a_bad_batch_count_is_refused_by_name():
  bad = types.ModuleType("bad_batches")
  for attr in registry.REQUIRED:
    setattr(bad, attr, getattr(sb, attr))
  bad.BATCHES_PER_STEP = 0
  with pytest.raises(ValueError, match="BATCHES_PER_STEP must be an int >= 1"):
    registry.method_record(bad, "bad_batches")


@pytest.mark.slow  # an end-to-end run; CI runs it (`-m ""`)
@pytest.mark.parametrize("random", [False, True])
def test_a_run_charges_its_scoring_forwards_and_selects_the_hardest(random, tmp_path):
  c = rh.mlp_config(steps=20, **method_config())
  c.hybrid.selective = registry.load_method("selective_backprop").default_config()
  c.hybrid.selective.random = random
  summary = train_lib.train(c, str(tmp_path), **rh.mlp_task())
  assert summary["backward_passes"] == 20 and summary["validation_forwards"] == 2 * 20
  assert summary["phase_steps"]["PREDICT"] == 0 and summary["memory"]["growth_bytes"] == 0
  rows = [r for r in writers.read_jsonl(str(tmp_path / "metrics.jsonl")) if r["kind"] == "train"]
  gaps = np.array([r["selected_loss"] - r["scored_loss"] for r in rows])
  assert len(gaps) == 20
  if random:
    assert abs(gaps.mean()) < 0.5 * gaps.std() + 1e-3  # a random half: no systematic gap
  else:
    assert np.all(gaps >= -1e-6) and gaps.mean() > 0  # the top half's mean loss is above the whole's


def test_only_leaves_along_the_batch_axis_are_joined():
  def train_batch(i):
    return {"x": np.full((8, 3), i, np.float32), "key": np.array([i, 7], np.uint32), "scale": np.float32(1)}

  got = train_lib.step_batches(rh.mlp_config(**method_config()), train_batch)(2)
  chex.assert_shape(got["x"], (16, 3))
  chex.assert_trees_all_equal(got["x"][:8], train_batch(4)["x"])
  chex.assert_trees_all_equal(got["x"][8:], train_batch(5)["x"])
  chex.assert_trees_all_equal(got["key"], train_batch(4)["key"])  # a (2,) key is shared, not joined
