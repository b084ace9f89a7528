"""The baseline trainer: optimizer, gradient accumulation, checkpoint resume, config errors, CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import micro_config
from experiments import gpt2_small as experiment
from hybridjax import checkpoint as ckpt_lib
from hybridjax import config as config_lib
from hybridjax import trainer
from hybridjax.models import mlp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mlp_setup(seed=0):
  model = mlp.MLP(features=(16, 16), n_out=1)
  x, y = mlp.make_regression_problem(seed, n_in=4)
  params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 4)))["params"]
  return model, x, y, params


def test_schedule_warmup_and_cosine():
  c = config_lib.default_optim_config()
  c.learning_rate, c.warmup_steps, c.min_lr_ratio = 1.0, 10, 0.1
  sched = trainer.make_schedule(c, 100)
  assert float(sched(0)) == 0.0
  np.testing.assert_allclose(float(sched(10)), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(sched(100)), 0.1, rtol=1e-5)
  assert float(sched(5)) == pytest.approx(0.5)


def test_sync_schedule_follows_global_step():
  c = config_lib.default_optim_config()
  c.learning_rate, c.warmup_steps = 1.0, 10
  tx = trainer.make_optimizer(c, 100)
  params = {"w": jnp.ones((3, 3))}
  state = tx.init(params)
  state = trainer.sync_schedule(state, jnp.asarray(5, jnp.int32))
  _, state = tx.update({"w": jnp.ones((3, 3))}, state, params)
  assert float(trainer.current_learning_rate(state)) == pytest.approx(0.5)


class GradAccumulationTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_grad_accumulation_matches_full_batch(self):
    model, x, y, params = _mlp_setup()
    loss_fn = mlp.make_loss_fn(model)
    batch = mlp.regression_batch(x, y, step=0, batch_size=16, seed=0)
    full = self.variant(lambda p, b: trainer.loss_and_grads(loss_fn, p, b, 1))(params, batch)
    acc = self.variant(lambda p, b: trainer.loss_and_grads(loss_fn, p, b, 4))(params, batch)
    chex.assert_trees_all_close(full, acc, rtol=1e-5, atol=1e-6)


def test_train_step_donates_and_learns():
  model, x, y, params = _mlp_setup()
  loss_fn = mlp.make_loss_fn(model)
  c = config_lib.default_optim_config()
  c.learning_rate, c.warmup_steps = 1e-2, 0
  tx = trainer.make_optimizer(c, 200)
  step = trainer.make_train_step(loss_fn, tx)
  state = trainer.init_train_state(params, tx)
  losses = []
  for i in range(60):
    old = state
    state, m = step(state, mlp.regression_batch(x, y, step=i, batch_size=32, seed=0))
    losses.append(float(m["loss"]))
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old))
  assert losses[-1] < 0.5 * losses[0]


def _run(config, workdir, hooks=None):
  task = experiment.build_task(config)
  return trainer.train(config, str(workdir), init_params=task["init_params"],
                       loss_fn=task["loss_fn"], train_batch=task["train_batch"],
                       eval_batches=task["eval_batches"], tokens_per_step=task["tokens_per_step"],
                       hooks=hooks)


def _final_params(workdir, config):
  task = experiment.build_task(config)
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"))
  step = manager.latest_step()
  tx = trainer.make_optimizer(config.optim, config.trainer.steps)
  abstract = jax.eval_shape(lambda: trainer.init_train_state(
      task["init_params"](jax.random.PRNGKey(0)), tx))
  state, meta = ckpt_lib.restore(manager, step, abstract)
  manager.close()
  return step, state


def test_tiny_run_learns(tmp_path):
  c = micro_config(steps=40)
  c.trainer.eval_every = 20
  summary = _run(c, tmp_path / "run")
  assert summary["final_eval_loss"] < 0.8 * np.log(256)
  assert summary["first_train_loss"] > summary["final_eval_loss"]
  assert os.path.exists(tmp_path / "run" / "metrics.jsonl")
  assert os.listdir(tmp_path / "run" / "tb")


def test_resume_is_bit_exact(tmp_path):
  c = micro_config(steps=20)
  c.trainer.checkpoint_every = 10
  _run(c, tmp_path / "straight")

  class Interrupt(Exception):
    pass

  def on_log(step, record):
    if step == 15:  # after the checkpoint at step 10 has been written
      raise Interrupt()

  with pytest.raises(Interrupt):
    _run(c, tmp_path / "resumed", hooks={"on_log": on_log})
  summary = _run(c, tmp_path / "resumed")
  assert summary["start_step"] == 10
  step_a, a = _final_params(tmp_path / "straight", c)
  step_b, b = _final_params(tmp_path / "resumed", c)
  assert step_a == step_b == 20
  chex.assert_trees_all_equal(a, b)


def test_resume_refuses_other_config(tmp_path):
  c = micro_config(steps=10)
  _run(c, tmp_path / "run")
  c2 = micro_config(steps=10)
  c2.optim.learning_rate = 1e-4
  with pytest.raises(ValueError, match="optim.learning_rate"):
    _run(c2, tmp_path / "run")
  c3 = micro_config(steps=10)
  c3.model.d_model = 64
  c3.resume = "force"
  with pytest.raises(ValueError, match="does not match"):
    _run(c3, tmp_path / "run")
  assert os.listdir(tmp_path / "run" / "checkpoints")  # nothing deleted


@pytest.mark.parametrize("field,value,match", [
    ("trainer.steps", -5, "trainer.steps"),
    ("trainer.grad_accum", 3, "trainer.batch_size"),
    ("optim.learning_rate", 0.0, "optim.learning_rate"),
    ("model.n_head", 5, "model.d_model"),
    ("data.tokenizer", "wordpiece", "data.tokenizer"),
    ("hybrid.max_predict_steps", 0, "hybrid.max_predict_steps"),
    ("hybrid.confidence_threshold", 1.5, "hybrid.confidence_threshold"),
    ("mode", "fast", "mode"),
])
def test_config_errors_name_the_field(field, value, match):
  c = micro_config()
  node = c
  *parents, leaf = field.split(".")
  for p in parents:
    node = node[p]
  with c.unlocked():
    node[leaf] = value
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c)


def test_default_config_is_valid():
  from experiments.configs import gpt2_small
  for preset in ("tiny", "small", "124m"):
    config_lib.validate(gpt2_small.get_config(preset))


def _cli(*args, timeout=120):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.gpt2_small", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout, env=env)


def test_cli_rejects_unknown_key_and_bad_value(tmp_path):
  r = _cli("--config.trainer.stepz=5", f"--workdir={tmp_path}/a")
  assert r.returncode != 0 and "stepz" in r.stderr
  r = _cli("--config.trainer.steps=-3", f"--workdir={tmp_path}/b")
  assert r.returncode != 0 and "trainer.steps" in r.stderr
  assert not os.path.exists(tmp_path / "b")  # failed before anything was written


def test_cli_missing_corpus(tmp_path):
  r = _cli(f"--config.data.path={tmp_path}/nope.txt", f"--workdir={tmp_path}/c")
  assert r.returncode != 0 and "data.path" in r.stderr


# Hybrid resume from a checkpoint in each of the four phases: tests/test_reliability.py.
