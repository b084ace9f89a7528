"""Weight averaging (`trainer.averaging='ema'`): the bias-corrected average itself, and its life in
the train state of both modes: donated, checkpointed, resumed bit-exactly, evaluated raw and averaged,
one params-sized buffer and no memory growth."""

from __future__ import annotations

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cached, micro_config, restore_latest
from conftest import run_experiment as _run
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import gpt2_small as experiment
from hybridjax import optim, writers
from hybridjax.loop import baseline, drivers


def _tree_bytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


class AverageTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_average_weights_are_the_bias_corrected_ema(self):
    beta, n = 0.9, 7
    thetas = [{"w": jnp.full((3,), float(i + 1) ** 2), "b": jnp.asarray(float(-i))} for i in range(n)]
    avg = optim.Averaging(params=jax.tree.map(jnp.zeros_like, thetas[0]), beta=jnp.asarray(beta, jnp.float32))
    update = self.variant(optim.update_average)
    for i, theta in enumerate(thetas):
      avg = update(avg, theta, jnp.asarray(i + 1))
      if i == 0:  # the first average is the params: nothing of the initial buffer is left
        chex.assert_trees_all_close(avg.params, theta)
    w = np.array([beta ** (n - 1 - i) for i in range(n)])
    w /= w.sum()
    expected = jax.tree.map(lambda *xs: sum(wi * x for wi, x in zip(w, xs)), *thetas)
    chex.assert_trees_all_close(avg.params, expected, rtol=1e-5)

  def test_none_stays_none_and_bad_beta_is_refused(self):
    assert optim.update_average(None, {"w": jnp.ones(2)}, 1) is None
    with pytest.raises(ValueError, match="beta"):
      optim.init_train_state({"w": jnp.ones(2)}, optim.make_optimizer(micro_config().optim), 1.0)


@settings(max_examples=30, deadline=None)
@given(beta=st.floats(0.5, 0.999), n=st.integers(1, 40), c=st.floats(-3, 3))
def test_average_of_a_constant_is_the_constant(beta, n, c):
  avg = optim.Averaging(params={"w": jnp.full((2,), 123.0)}, beta=jnp.asarray(beta, jnp.float32))
  for i in range(n):
    avg = optim.update_average(avg, {"w": jnp.full((2,), c)}, i + 1)
  np.testing.assert_allclose(np.asarray(avg.params["w"]), c, atol=1e-4 * (1 + abs(c)))


def test_averaging_state_is_one_params_sized_buffer_and_is_donated():
  config = micro_config()
  task = experiment.build_task(config)
  tx = optim.make_optimizer(config.optim)
  params = task.init_params(jax.random.PRNGKey(0))
  plain = jax.eval_shape(lambda p: optim.init_train_state(p, tx), params)
  averaged = jax.eval_shape(lambda p: optim.init_train_state(p, tx, 0.99), params)
  # The average (float32 params) and its beta: nothing else.
  assert _tree_bytes(averaged) - _tree_bytes(plain) == _tree_bytes(params) + 4
  schedule = optim.make_schedule(config.optim, 10)
  step = baseline.make_train_step(task.loss_fn, tx)  # the baseline's one step program
  state = optim.init_train_state(params, tx, 0.99)
  for i in range(3):
    old = state.averaging.params
    state, _ = step(state, task.train_batch(i), schedule)
    jax.block_until_ready(state)
    assert all(x.is_deleted() for x in jax.tree.leaves(old)), f"the average was not donated at step {i}"
  assert int(state.step) == 3


def _final_train_state(workdir, config):
  """The `optim.TrainState` of the latest checkpoint (inside the hybrid state in hybrid mode)."""
  driver = drivers.HybridDriver if config.mode == "hybrid" else drivers.BaselineDriver
  return driver.train_state(restore_latest(workdir, config)[1])


# Slow-marked for the default suite's time (CI runs both); the default suite keeps a bit-exact resume
# (tests/loop/test_train.py) and the quick benchmark protocol, which trains runs with averaging and
# checks their model is the averaged params.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["baseline", "hybrid"])
def test_averaged_run_resumes_bit_exactly_and_reports_both_evals(tmp_path, jax_cache, mode):
  c = cached(micro_config(mode=mode, steps=20), jax_cache)
  c.trainer.update(checkpoint_every=10, eval_every=10, averaging="ema", averaging_beta=0.9)
  if mode == "hybrid":
    c.hybrid.update(confidence_threshold=0.0, warmup_steps=4, full_steps=2)  # predicted steps before step 20
  straight = _run(c, tmp_path / "straight")

  class Interrupt(Exception):
    pass

  def on_log(step, record):
    if step == 15:
      raise Interrupt()

  with pytest.raises(Interrupt):
    _run(c, tmp_path / "resumed", hooks={"on_log": on_log})
  resumed = _run(c, tmp_path / "resumed")
  assert resumed["start_step"] == 10
  a, b = _final_train_state(tmp_path / "straight", c), _final_train_state(tmp_path / "resumed", c)
  assert a.averaging is not None
  chex.assert_trees_all_equal(a, b)
  # The average moved away from the params (it lags them) and is what the run calls its model.
  assert not np.allclose(np.asarray(a.params["wte"]["embedding"]), np.asarray(a.averaging.params["wte"]["embedding"]))
  evals = [r for r in writers.read_jsonl(os.path.join(tmp_path / "straight", "metrics.jsonl")) if r["kind"] == "eval"]
  assert [r["step"] for r in evals] == [10, 20]
  for r in evals:
    assert r["eval_loss"] == r["eval_loss_averaged"] != r["eval_loss_raw"]
  assert straight["final_eval_loss"] == straight["final_eval_loss_averaged"] == evals[-1]["eval_loss_averaged"]
  assert straight["final_eval_loss_raw"] == evals[-1]["eval_loss_raw"]
  assert straight["memory"]["growth_bytes"] == 0
  if mode == "hybrid":
    assert straight["phase_steps"]["PREDICT"] > 0


def test_averaging_off_changes_nothing(tmp_path, jax_cache):
  """With averaging off the state has no average and the records have no averaged fields."""
  c = cached(micro_config(steps=10), jax_cache)
  c.trainer.eval_every = 10
  summary = _run(c, tmp_path / "run")
  assert "final_eval_loss_raw" not in summary
  assert _final_train_state(tmp_path / "run", c).averaging is None
