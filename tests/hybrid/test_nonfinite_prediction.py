"""A predicted step that leaves a non-finite value in the params or the method's state is discarded
inside the step (`hybrid.step.discard_nonfinite`), whatever the method: the state before it is kept,
the step counts as a non-finite prediction and ends the PREDICT phase. A run that cannot recover
says it was the method's predicted steps, and the log never shows an older loss as the current one.

The method is tests/hybrid/nan_predictor.py, a plug-in whose predicted steps turn NaN on purpose, on
a one-layer MLP.
"""

from __future__ import annotations

import math
from typing import Any

import chex
import jax
import nan_predictor  # tests/hybrid/ is on sys.path, as tests/ is for the helpers
import numpy as np
import pytest
from conftest import abstract_driver_state, restore_checkpoint

from hybridjax import config as config_lib
from hybridjax.hybrid import state as state_lib
from hybridjax.hybrid.context import make_step_info
from hybridjax.hybrid.phases import Branch, Exit, Phase
from hybridjax.loop import train as train_lib
from hybridjax.methods import velocity as velocity_method
from hybridjax.methods.velocity.plan import VelocityState, init_plan
from hybridjax.models import mlp

METHOD = "nan_predictor"  # tests/hybrid/nan_predictor.py, loaded by its module name as a user's method is
STEPS = 40  # every run's length: a static part of the programs, so all tests share them


def _task():
  """The MLP problem. Every batch carries a `scale` on the loss (NaN injects a fault in that real
  step) and what the method's predicted step poisons (`nan_predictor.PARAMS` by default), both
  read at run time, so every test here runs the same compiled programs; `faults` sets them per step."""
  model = mlp.MLP(features=(16,), n_out=1)
  x, y = mlp.make_regression_problem(0, n_in=4, n=256)
  base = mlp.make_loss_fn(model)
  faults: dict[int, dict[str, Any]] = {}

  def loss_fn(params, batch):
    loss, aux = base(params, batch)
    return loss * batch["scale"], aux

  def train_batch(i):
    b = mlp.regression_batch(x[:192], y[:192], i, 32, seed=0)
    b["scale"] = np.float32(faults.get(i, {}).get("scale", 1.0))
    b["poison"] = np.int32(faults.get(i, {}).get("poison", nan_predictor.PARAMS))
    return b

  task = dict(
    init_params=lambda rng: model.init(rng, x[:1])["params"],
    loss_fn=loss_fn,
    train_batch=train_batch,
    eval_batches=[train_batch(10_000)],
  )
  return task, faults


def _config(dispatch: str = "switch"):
  """WARMUP 3, FULL 2, then PREDICT phases of 2 predicted steps, CORRECT 2, a cooldown of 1."""
  c = config_lib.default_config("hybrid")
  c.hybrid.method = METHOD
  c.hybrid.update(warmup_steps=3, full_steps=2, max_predict_steps=2, correct_steps=2, dispatch=dispatch)
  c.hybrid.health.cooldown_steps = 1
  c.trainer.update(steps=STEPS, progress=False, log_every=1, eval_every=0, checkpoint_every=0, compile_cache=False)
  c.trainer.update(batch_size=32, eval_batches=1)  # what _task gives
  c.optim.update(learning_rate=1e-2, warmup_steps=2)
  return c


def _host_copy(tree):
  """`tree` copied to the host (not a view of a buffer the next step donates)."""
  return jax.tree.map(np.array, jax.device_get(tree))


def _to_predicted_step(driver, task, state, step: int = 0):
  """Real steps until the next step is a predicted one; returns (state, the step index)."""
  while int(state.controller.next_branch) != Branch.PREDICT_STEP:
    state, _ = driver.run(state, [task["train_batch"](step)])
    step += 1
    assert step < 20, "never reached a predicted step"
  return state, step


@pytest.mark.parametrize(
  ("poison", "dispatch"),
  [
    ("params", "switch"),
    ("state", "switch"),
    ("none", "switch"),
    pytest.param("params", "host", marks=pytest.mark.slow),  # compiles the three transitions apart
  ],
)
def test_a_non_finite_predicted_step_is_discarded_and_ends_predict(poison, dispatch):
  task, faults = _task()
  config = _config(dispatch)
  driver = train_lib.make_driver(config, init_params=task["init_params"], loss_fn=task["loss_fn"])
  state = jax.device_put(driver.init_state(), jax.devices()[0])
  state, i = _to_predicted_step(driver, task, state)
  # The first predicted step of the phase is finite and kept; the second is poisoned (unless 'none').
  faults[i] = {"poison": nan_predictor.NONE}
  faults[i + 1] = {"poison": getattr(nan_predictor, poison.upper())}
  start = _host_copy(state.train.params)
  state, m = driver.run(state, [task["train_batch"](i)])
  assert not bool(m["discarded"]) and int(state.controller.phase) == Phase.PREDICT
  kept = _host_copy(state.train.params)
  chex.assert_trees_all_close(kept, jax.tree.map(lambda p: p + nan_predictor.MOVE, start))  # it moved
  before = _host_copy(state)
  state, m = driver.run(state, [task["train_batch"](i + 1)])
  after, m = _host_copy((state, m))
  c0, c = before.controller, after.controller
  chex.assert_tree_all_finite(after.train.params)
  if poison == "none":  # the control: a finite predicted step is kept, and nothing is counted
    chex.assert_trees_all_close(after.train.params, jax.tree.map(lambda p: p + nan_predictor.MOVE, kept))
    assert not bool(m["discarded"]) and int(c.events[0]) == 0 and int(c.discarded) == 0
    assert int(after.method.predicted) == 2
    return
  # The state before the step, bit for bit: params, optimizer state, the method's state.
  chex.assert_trees_all_equal(after.train.params, before.train.params)
  chex.assert_trees_all_equal(after.train.opt_state, before.train.opt_state)
  chex.assert_trees_all_equal(after.method, before.method)
  # Only the schedule step moved on (the step used its batch), as every step does.
  assert int(after.train.step) == int(before.train.step) + 1 and int(c.batches) == int(c0.batches) + 1
  # Counted as a non-finite prediction of a predicted step, which ends PREDICT.
  assert bool(m["discarded"]) and bool(m["diverged"]) and not np.any(m["alpha"])
  assert int(c.events[0]) == int(c0.events[0]) + 1
  assert int(c.nonfinite_predicted) == int(c0.nonfinite_predicted) + 1
  assert int(c.discarded) == int(c0.discarded) + 1
  assert int(c.phase) == Phase.CORRECT and int(c.last_exit) == Exit.NONFINITE
  assert int(c.cooldown) == config.hybrid.health.cooldown_steps
  assert int(after.train.nonfinite_streak) == 0  # no real update was skipped


def test_a_run_of_discarded_predictions_stops_naming_the_method_and_keeps_good_checkpoints(tmp_path):
  task, _ = _task()  # every predicted step poisons the params
  config = _config()
  config.hybrid.health.max_events = 3
  config.trainer.checkpoint_every = 5
  records = []
  with pytest.raises(train_lib.TrainingDiverged) as e:
    train_lib.train(config, str(tmp_path / "run"), hooks={"on_log": lambda s, r: records.append((s, r))}, **task)
  msg = str(e.value)
  # Every PREDICT phase's first step is discarded: the 3rd is the stop (steps 6, 9, 12).
  assert msg.startswith(
    "training diverged: 3 non-finite events by step 12 (limit --config.hybrid.health.max_events=3), "
    "3 of them predicted steps of method 'nan_predictor' (PREDICT; 3 discarded: they left a non-finite "
    "value in the params or the method's state, and the state before them was kept) and 0 real steps. "
  ), msg
  assert msg.endswith(
    "The predicted steps of method 'nan_predictor' raised most of them, not the optimizer's updates: "
    "check the method, or train without predicted steps (--config.hybrid.enable_predict=False)."
  ), msg
  assert "learning_rate" not in msg
  assert "the last good checkpoint, step 10, is kept" in msg
  # The checkpoints saved are good states: finite params, nothing of a discarded step.
  abstract = abstract_driver_state(config, task)
  for step in (5, 10):
    _, state, _ = restore_checkpoint(tmp_path / "run", abstract, step)
    chex.assert_tree_all_finite(state.train.params)
  # The log: each discarded step's record says so, with no loss; every other record has its own.
  discarded = [s for s, r in records if r["discarded"]]
  assert discarded == [6, 9, 12], discarded
  for s, r in records:
    assert math.isnan(r["loss"]) == r["discarded"], (s, r["loss"])
    assert train_lib.format_loss(r) == ("discarded" if r["discarded"] else f"{r['loss']:.3f}")
  assert records[-1][1]["discarded_steps"] == 3


def test_real_steps_non_finite_losses_are_logged_as_nan_and_name_the_method_s_own_real_step(tmp_path):
  # Real steps (WARMUP, FULL) with a NaN loss, never two in a row: each update is skipped, each log
  # record says NaN (not the last finite loss), and the third stops the run, naming the method's own
  # real step (nan_predictor defines full_step) beside the learning rate and the data.
  task, faults = _task()
  for i in (0, 2, 4):  # the batches of steps 1, 3 and 5
    faults[i] = {"scale": np.nan}
  config = _config()
  config.hybrid.health.max_events = 3
  records = {}
  with pytest.raises(train_lib.TrainingDiverged) as e:
    train_lib.train(config, str(tmp_path / "run"), hooks={"on_log": lambda s, r: records.update({s: r})}, **task)
  assert sorted(records) == [1, 2, 3, 4, 5]
  for s, r in records.items():
    assert math.isnan(r["loss"]) == (s in (1, 3, 5)) and not r["discarded"], (s, r["loss"])
    assert r["nonfinite_streak"] == (s in (1, 3, 5))
    assert train_lib.format_loss(r) == ("nan" if s in (1, 3, 5) else f"{r['loss']:.3f}")
  msg = str(e.value)
  assert "3 non-finite events by step 5 (limit --config.hybrid.health.max_events=3), all of them real steps of " in msg
  assert "method 'nan_predictor' (a non-finite loss or gradient; now in FULL)" in msg, msg
  assert msg.endswith(
    "Method 'nan_predictor' takes its real steps with its own full_step (nan_predictor): check it, or lower "
    "--config.optim.learning_rate (now 0.01) or check the data."
  ), msg


def test_the_velocity_predictor_rolls_back_only_what_a_discarded_step_did_not_undo():
  # At the end of a PREDICT phase by a discarded step, the velocity predictor's CORRECT entry rolls
  # back the alphas applied since the last good validation before the step (its state's, which the
  # framework kept), not the step's own report, which counts the move that was never applied.
  g = 2
  applied, step_alpha = np.asarray([0.5, 0.25], np.float32), np.asarray([2.0, 3.0], np.float32)
  plan = init_plan(max_predict_steps=4, n_groups=g, feature_dim=3, accuracy_window=4)
  vstate = VelocityState(velocity=None, dynamics=None, corrector=None, history=None, plan=plan)
  vstate = vstate.replace(plan=plan.replace(alpha_since_good=applied))
  before = _controller(Phase.PREDICT)
  after = _controller(Phase.CORRECT)

  def info(discarded):
    return make_step_info(
      loss=np.nan,
      predicted_loss=1.0,
      grad_norm=0.0,
      was_real=False,
      finite=True,
      explosion=False,
      spike=False,
      validated=True,
      diverged=False,
      nonfinite_prediction=True,
      rolled_back=True,
      alpha=np.zeros(g),
      discarded=discarded,
      extra=applied + step_alpha,  # what the step's own report asks to roll back
    )

  rolled = velocity_method.on_transition(None, vstate, before, after, info(True)).plan.rollback_alpha
  chex.assert_trees_all_equal(np.asarray(rolled), applied)
  # A step that was kept (a non-finite validation of finite params) rolls back its own report.
  rolled = velocity_method.on_transition(None, vstate, before, after, info(False)).plan.rollback_alpha
  chex.assert_trees_all_equal(np.asarray(rolled), applied + step_alpha)


def _controller(phase):
  return state_lib.init_controller().replace(phase=np.int32(phase))


def _summary_of(discarded: int, predict_steps: int, real_steps: int):
  """The driver's summary of a run whose controller counted `predict_steps` predicted steps (of which
  `discarded` were discarded) and `real_steps` real ones, and the summary table the run prints."""
  task, _ = _task()
  config = _config()
  driver = train_lib.make_driver(config, init_params=task["init_params"], loss_fn=task["loss_fn"])
  state = driver.init_state()
  c = state.controller.replace(
    phase_steps=np.asarray([0, real_steps, predict_steps, 0], np.int32),
    backward_passes=np.int32(real_steps),
    discarded=np.int32(discarded),
  )
  summary = driver.summary(state.replace(controller=c))
  timing = dict(mode="hybrid", start_step=0, steps=real_steps + predict_steps, first_train_loss=1.0)
  timing.update(final_eval_loss=1.0, compile_s=0.0, train_s=0.0, s_per_step=0.0)
  return summary, train_lib.format_summary({**timing, **summary})


def test_discarded_predicted_steps_save_no_backward_pass_and_a_run_of_them_says_so():
  summary, table = _summary_of(discarded=5, predict_steps=5, real_steps=35)
  assert summary["backward_passes_saved"] == 0 and summary["predicted_steps_discarded"] == 5
  assert "backward passes saved      0" in table.splitlines(), table
  assert table.splitlines()[-1] == (
    "WARNING: 5 of the 5 predicted steps of method 'nan_predictor' were discarded (they left a non-finite value "
    "in the params or the method's state, and the state before them was kept): they saved no backward pass, and "
    "the run trained on its real steps alone (predict fraction 12% counts the steps taken in PREDICT, kept or not)"
  )
  # A few discarded among many kept: counted, not warned about.
  summary, table = _summary_of(discarded=1, predict_steps=10, real_steps=30)
  assert summary["backward_passes_saved"] == 9 and "warnings" not in summary and "WARNING" not in table


@pytest.mark.slow
def test_a_run_whose_every_prediction_is_discarded_reports_no_saving(tmp_path, capsys):
  task, _ = _task()  # every predicted step poisons the params
  config = _config()
  config.hybrid.health.max_events = 1000  # the run finishes
  summary = train_lib.train(config, str(tmp_path / "run"), **task)
  predicted = summary["steps"] - summary["backward_passes"]
  assert predicted > 0 and summary["predicted_steps_discarded"] == predicted
  assert summary["backward_passes_saved"] == 0
  out = capsys.readouterr().out
  assert f"WARNING: {predicted} of the {predicted} predicted steps of method 'nan_predictor' were discarded" in out
