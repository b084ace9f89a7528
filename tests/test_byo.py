"""Bring your own optimizer, model and weights: `train(tx=...)`, its refusals, `export_params`, the
GPT-2 task's Hugging Face export, and the README's example run exactly as printed."""

from __future__ import annotations

import os
import re
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import abstract_driver_state, cached, micro_config, restore_checkpoint, restore_latest, run_experiment

import hybridjax
from hybridjax import config as config_lib
from hybridjax import optim, optimizers, preflight
from hybridjax.models import mlp
from hybridjax.optimizers import user as user_optimizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARAMS = {"w": jnp.ones((3, 2)), "b": jnp.zeros((2,))}


def _mlp_task(n_in: int = 4):
  """A small regression task through `train()`'s keyword arguments."""
  model = mlp.MLP(features=(16,), n_out=1)
  x, y = mlp.make_regression_problem(0, n_in=n_in, n=256)
  return dict(
    init_params=lambda rng: model.init(rng, x[:1])["params"],
    loss_fn=mlp.make_loss_fn(model),
    train_batch=lambda step: mlp.regression_batch(x[:192], y[:192], step, 32, seed=0),
    eval_batches=[{"x": x[192:], "y": y[192:]}],
  )


def _config(mode="baseline", steps=30, **trainer):
  c = config_lib.default_config(mode)
  c.trainer.update(steps=steps, progress=False, log_every=10, eval_every=0, checkpoint_every=10)
  c.trainer.update(batch_size=32, eval_batches=1, **trainer)  # what _mlp_task gives
  c.optim.update(learning_rate=1e-2, warmup_steps=5)
  if mode == "hybrid":  # the baseline reads no hybrid setting (`train` refuses one set)
    c.hybrid.update(warmup_steps=10, full_steps=5)
    c.hybrid.velocity.update(history_size=16, window=8)
    c.hybrid.velocity.rssm.update(deter=16, latent=4, hidden=16, ensemble=2)
  return c


# --- resolve_optimizer: what a user's optimizer must be ----------------------------------------------


def _named(name="mine"):
  c = config_lib.default_optim_config()
  c.name = name
  return c


def test_a_factory_is_wrapped_so_that_the_schedule_drives_it():
  for factory in (lambda learning_rate: optax.sgd(learning_rate), lambda lr: optax.sgd(lr)):
    tx = optim.resolve_optimizer(_named(), PARAMS, factory)
    assert optim.injected_learning_rates(tx, PARAMS) == 1
    state = tx.init(PARAMS)
    grads = jax.tree.map(jnp.ones_like, PARAMS)
    for lr in (0.5, 0.25):
      updates, _ = tx.update(grads, optim.with_learning_rate(state, jnp.float32(lr)), PARAMS)
      chex.assert_trees_all_close(updates, jax.tree.map(lambda g: -lr * g, grads))


def test_an_injected_transformation_is_taken_as_it_is():
  tx = optax.inject_hyperparams(optax.adam)(learning_rate=0.0)
  assert optim.resolve_optimizer(_named(), PARAMS, tx) is tx


@pytest.mark.parametrize(
  "tx, match",
  [
    (optax.adamw(1e-3), "no injected learning rate.*lambda learning_rate"),
    (lambda lr, momentum: optax.sgd(lr, momentum), "must take the learning rate"),
    (3e-4, "takes an optax.GradientTransformation or a factory"),
  ],
)
def test_an_optimizer_the_schedule_cannot_drive_is_refused(tx, match):
  with pytest.raises(ValueError, match=match):
    optim.resolve_optimizer(_named(), PARAMS, tx)


def test_a_user_optimizer_needs_a_name_of_its_own():
  with pytest.raises(ValueError, match="optim.name='adamw' names a built-in"):
    optim.resolve_optimizer(_named("adamw"), PARAMS, lambda learning_rate: optax.sgd(learning_rate))
  with pytest.raises(ValueError, match="optim.name='mine' is not a built-in optimizer"):
    optim.resolve_optimizer(_named("mine"), PARAMS, None)
  bad = config_lib.default_config()
  bad.optim.name = ""
  with pytest.raises(ValueError, match="optim.name must be a non-empty name"):
    preflight.validate(bad)


def test_the_builtin_adamw_as_a_user_factory_trains_bit_for_bit_alike():
  # The built-in AdamW and the same AdamW handed in as a factory: the same schedule drives both.
  oc = config_lib.default_optim_config()
  builtin = optim.resolve_optimizer(oc, PARAMS)
  mine = optim.resolve_optimizer(
    _named(),
    PARAMS,
    lambda learning_rate: optax.chain(
      optax.clip_by_global_norm(oc.grad_clip),
      optax.adamw(
        learning_rate, b1=oc.b1, b2=oc.b2, eps=oc.eps, weight_decay=oc.weight_decay, mask=optimizers.adam._decay_mask
      ),
    ),
  )
  schedule = optim.make_schedule(oc, 20)
  task = _mlp_task()
  params = task["init_params"](jax.random.PRNGKey(0))
  runs = []
  for tx in (builtin, mine):
    step = jax.jit(lambda s, b, tx=tx: optim.train_step(s, b, schedule, loss_fn=task["loss_fn"], tx=tx))
    state = optim.init_train_state(params, tx)
    for i in range(8):
      state, _ = step(state, task["train_batch"](i))
    runs.append(state.params)
  chex.assert_trees_all_close(runs[0], runs[1], rtol=1e-6, atol=1e-7)
  assert not np.allclose(runs[0]["dense_0"]["kernel"], params["dense_0"]["kernel"])


def test_train_refuses_an_undrivable_optimizer_before_anything_is_written(tmp_path):
  c = _config()
  c.optim.name = "fixed_adamw"
  with pytest.raises(ValueError, match="no injected learning rate"):
    hybridjax.train(c, str(tmp_path / "run"), tx=optax.adamw(1e-3), **_mlp_task())
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


def _frozen_group_tx(params):
  """Two injected learning rates meant to differ: group 'b' (the biases) frozen at 0."""
  labels = jax.tree_util.tree_map_with_path(lambda path, p: "a" if p.ndim == 2 else "b", params)
  return optax.multi_transform(
    {
      "a": optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
      "b": optax.inject_hyperparams(optax.adam)(learning_rate=0.0),
    },
    labels,
  )


UNDRIVABLE = {
  # optax recomputes a schedule-valued hyperparameter from its own count, overwriting the injected rate.
  "schedule": (
    lambda params: optax.inject_hyperparams(optax.adam)(learning_rate=optax.constant_schedule(0.0)),
    r"has a schedule as its injected learning rate .* Give a number, the config's schedule drives it",
  ),
  "ignored": (
    lambda params: lambda learning_rate: optax.adam(1e-3),
    r"does not use the learning rate .* its updates do not depend on it",
  ),
  "ratios": (
    _frozen_group_tx,
    r"has 2 injected learning rates that differ .*=0\.01, .*=0\). .* Pass a factory learning_rate -> "
    r"transformation instead, with any per-group ratios inside it: tx=lambda lr: optax\.multi_transform",
  ),
  "nested": (
    lambda params: lambda lr: optax.inject_hyperparams(optax.adam)(learning_rate=lr * 0.5),
    r"holds an injected learning rate inside another .* keeps its initial value",
  ),
}


@pytest.mark.parametrize("case", sorted(UNDRIVABLE))
def test_train_refuses_an_optimizer_the_schedule_would_not_drive_before_the_workdir_exists(tmp_path, case):
  make_tx, match = UNDRIVABLE[case]
  c = _config()
  c.optim.name = "mine"
  task = _mlp_task()
  tx = make_tx(jax.eval_shape(task["init_params"], jax.random.PRNGKey(0)))
  with pytest.raises(ValueError, match=r"the optimizer 'mine' given to train\(tx=\.\.\.\) ") as e:
    hybridjax.train(c, str(tmp_path / "run"), tx=tx, **task)
  assert re.search(match, str(e.value)), str(e.value)
  assert not os.path.exists(tmp_path / "run")


def test_a_learning_rate_written_inside_inject_hyperparams_is_refused_unless_it_is_the_configs(tmp_path):
  # The README's second form of tx, with the user's rate in it: the schedule would write 3e-3 over it.
  c = _config()
  c.optim.update(name="my_adamw", learning_rate=3e-3)
  with pytest.raises(ValueError) as e:
    hybridjax.train(
      c, str(tmp_path / "run"), tx=optax.inject_hyperparams(optax.adamw)(learning_rate=1e-4), **_mlp_task()
    )
  assert str(e.value) == (
    "the optimizer 'my_adamw' given to train(tx=...) injects learning_rate=0.0001 "
    "(state.hyperparams['learning_rate']), but the config's schedule (--config.optim.schedule='cosine', "
    "peak --config.optim.learning_rate=0.003) writes its own rate over it before every update: the run "
    "would train at the schedule's rate, never at 0.0001. To train at 0.0001, set "
    "--config.optim.learning_rate=0.0001 (and inject that value, or 0.0); or pass a factory, "
    "tx=lambda learning_rate: optax.adamw(learning_rate)"
  )
  assert not os.path.exists(tmp_path / "run")
  # The config's own rate, or 0.0 (no rate stated), is what the schedule writes anyway: accepted.
  params = jax.eval_shape(_mlp_task()["init_params"], jax.random.PRNGKey(0))
  for lr in (3e-3, 0.0):
    tx = optim.resolve_optimizer(c.optim, params, optax.inject_hyperparams(optax.adamw)(learning_rate=lr))
    user_optimizer.check_user_optimizer(tx, params, c.optim)


def test_the_check_of_a_users_optimizer_accepts_what_the_schedule_drives():
  params = jax.eval_shape(_mlp_task()["init_params"], jax.random.PRNGKey(0))
  labels = jax.tree_util.tree_map_with_path(lambda path, p: "a" if p.ndim == 2 else "b", params)
  accepted = {
    "readme": lambda learning_rate: optax.chain(
      optax.clip_by_global_norm(1.0), optax.adamw(learning_rate, nesterov=True)
    ),
    "injected": optax.inject_hyperparams(optax.adamw)(learning_rate=0.0),
    "ratios in a factory": lambda lr: optax.multi_transform({"a": optax.adam(lr), "b": optax.adam(lr * 0.1)}, labels),
    "equal injected rates": optax.multi_transform(
      {"a": optax.inject_hyperparams(optax.adam)(learning_rate=0.0), "b": optax.inject_hyperparams(optax.sgd)(0.0)},
      labels,
    ),
  }
  for what, tx in accepted.items():
    resolved = optim.resolve_optimizer(_named(), params, tx)
    assert user_optimizer.user_optimizer_errors(resolved, params, _named()) == [], what
  # The built-in optimizers hold several injected rates, all equal, each reaching the updates.
  for name in optim.BUILTIN_OPTIMIZERS:
    oc = config_lib.default_optim_config()
    oc.name = name
    assert user_optimizer.user_optimizer_errors(optim.make_optimizer(oc), params, oc) == [], name


def test_the_check_finds_that_an_ignored_learning_rate_does_not_reach_the_updates():
  # The dead-code walk itself: the same optimizer with the rate used and ignored.
  used = optim.resolve_optimizer(_named(), PARAMS, lambda learning_rate: optax.adam(learning_rate))
  ignored = optim.resolve_optimizer(_named(), PARAMS, lambda learning_rate: optax.adam(1e-3))
  assert user_optimizer._learning_rate_reaches_updates(used, PARAMS)
  assert not user_optimizer._learning_rate_reaches_updates(ignored, PARAMS)
  frozen = _frozen_group_tx(PARAMS)
  assert [v for _, v in user_optimizer.injected_learning_rate_values(frozen, PARAMS)] == [pytest.approx(1e-2), 0.0]


def test_the_optimizer_is_part_of_the_run_record(tmp_path, jax_cache):
  # A run resumed with another optimizer's name is refused, naming the field; nothing is lost.
  c = cached(_config(steps=20), jax_cache)
  c.optim.name = "sgd_mine"
  task = _mlp_task()
  hybridjax.train(c, str(tmp_path / "run"), tx=lambda learning_rate: optax.sgd(learning_rate), **task)
  c.trainer.steps = 30
  c.optim.name = "adam_mine"
  with pytest.raises(ValueError, match="optim.name: checkpoint has 'sgd_mine', config has 'adam_mine'"):
    hybridjax.train(c, str(tmp_path / "run"), tx=lambda learning_rate: optax.adam(learning_rate), **task)
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["10", "20"]


# --- export_params ---------------------------------------------------------------------------------


def test_export_params_reads_the_raw_or_averaged_params_of_any_step(tmp_path, jax_cache):
  # A baseline run (the README example's test exports a hybrid run's averaged params).
  c = cached(_config(steps=20, averaging="ema", averaging_beta=0.9), jax_cache)
  summary = hybridjax.train(c, str(tmp_path / "run"), **_mlp_task())
  step, state = _restore_mlp(tmp_path / "run", c)
  assert step == 20
  averaged = hybridjax.export_params(tmp_path / "run")
  chex.assert_trees_all_equal(averaged, jax.device_get(state.averaging.params))
  chex.assert_trees_all_equal(hybridjax.export_params(tmp_path / "run", averaged=False), jax.device_get(state.params))
  # The exported params are the run's model: the loss the summary reported.
  task = _mlp_task()
  loss = float(jax.jit(task["loss_fn"])(averaged, task["eval_batches"][0])[0])
  assert loss == pytest.approx(summary["final_eval_loss"], rel=1e-6)
  earlier = hybridjax.export_params(tmp_path / "run", step=10)
  assert not np.array_equal(earlier["dense_0"]["kernel"], averaged["dense_0"]["kernel"])
  with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 15; its steps are \[10, 20\]"):
    hybridjax.export_params(tmp_path / "run", step=15)
  with pytest.raises(FileNotFoundError, match="holds no checkpoints"):
    hybridjax.export_params(tmp_path / "nothing")


def test_export_params_of_a_run_that_did_not_average_says_so(tmp_path, jax_cache):
  c = cached(_config(steps=10), jax_cache)
  hybridjax.train(c, str(tmp_path / "run"), **_mlp_task())
  _, state = _restore_mlp(tmp_path / "run", c)
  with pytest.warns(UserWarning, match="did not average its weights"):
    params = hybridjax.export_params(tmp_path / "run")
  chex.assert_trees_all_equal(params, jax.device_get(state.params))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    hybridjax.export_params(tmp_path / "run", averaged=False)


def _restore_mlp(workdir, config):
  step, state, _ = restore_checkpoint(workdir, abstract_driver_state(config, _mlp_task()))
  return step, state


@pytest.mark.slow  # a GPT-2 run and its export (9 s); the HF parity test in the default suite checks the mapping
def test_a_gpt2_run_writes_hugging_face_safetensors(tmp_path, jax_cache):
  from experiments import gpt2_small
  from hybridjax.models import gpt2, hf

  c = cached(micro_config(steps=10), jax_cache)
  c.trainer.update(averaging="ema", averaging_beta=0.9)
  run_experiment(c, tmp_path / "run")
  shape = gpt2_small.write_hf_safetensors(str(tmp_path / "run"), str(tmp_path / "hf" / "model.safetensors"))
  assert shape == gpt2.GPT2Config(**c.model.to_dict())
  loaded_cfg, loaded = hf.load_hf_checkpoint(tmp_path / "hf", n_head=c.model.n_head)
  assert loaded_cfg.n_layer == c.model.n_layer and loaded_cfg.d_model == c.model.d_model
  _, state = restore_latest(tmp_path / "run", c)
  chex.assert_trees_all_equal(loaded, jax.device_get(state.averaging.params))


# --- the README's example ----------------------------------------------------------------------------


def readme_example() -> str:
  """The Python block between README.md's bring-your-own markers, as printed."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  m = re.search(r"<!-- byo-example:start -->\s*```python\n(.*?)```\s*<!-- byo-example:end -->", text, re.S)
  assert m, "README.md lost its bring-your-own example markers (<!-- byo-example:start/end -->)"
  return m.group(1)


@pytest.mark.slow
def test_the_readme_example_runs_as_printed(tmp_path, monkeypatch):
  code = readme_example()
  assert len(code.strip().splitlines()) <= 40
  monkeypatch.chdir(tmp_path)
  namespace: dict = {"__name__": "readme_example"}
  exec(compile(code, "README.md (bring your own)", "exec"), namespace)
  summary, params, model = namespace["summary"], namespace["params"], namespace["model"]
  # A hybrid run of the user's model and optimizer, which learned; its exported weights are its model.
  assert summary["mode"] == "hybrid" and summary["steps"] == namespace["config"].trainer.steps
  assert summary["final_eval_loss"] < 0.5 * summary["first_train_loss"]
  chex.assert_trees_all_equal_shapes(params, model.init(jax.random.PRNGKey(0), namespace["data"][:1])["params"])
  loss = float(namespace["loss_fn"](params, {"x": namespace["data"][1792:], "y": namespace["labels"][1792:]})[0])
  better = min(summary["final_eval_loss_raw"], summary["final_eval_loss_averaged"])
  assert loss == pytest.approx(better, rel=1e-5)  # the better weights were exported
  assert summary["phase_steps"]["PREDICT"] > 0 and summary["backward_passes_saved"] > 0  # it predicts
  assert os.path.isdir(tmp_path / "runs" / "classifier" / "checkpoints")
