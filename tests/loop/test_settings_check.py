"""The trainer's refusals of what a run would silently ignore or change (`hybridjax.settings_check`):
a resume with another `trainer.steps` where the schedule depends on it, an empty eval set, hybrid
settings the run does not read, a misspelt method hook; and `export_params`' warning for a run that
stopped early."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import sys
import types
import warnings

import chex
import jax.numpy as jnp
import numpy as np
import pytest
import reliability_helper as rh

import hybridjax
from hybridjax import config as config_lib
from hybridjax import optim, registry, settings_check
from hybridjax.hybrid.context import ControllerSettings
from hybridjax.loop import train as train_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lrs(optim_cfg, total: int, upto: int) -> np.ndarray:
  return np.asarray(optim.learning_rate(optim.make_schedule(optim_cfg, total), jnp.arange(upto)))


# --- which runs may change trainer.steps -----------------------------------------------------------


def test_the_schedule_depends_on_the_length_exactly_when_steps_dependence_says():
  """The rule matches the schedule: those it calls independent give the same learning rate at every
  step for 300 and 600 steps, the others do not."""
  cases = {
    "cosine over the run": {},
    "wsd over the run": {"schedule": "wsd"},
    "cosine with its own decay_steps": {"decay_steps": 400},
    "wsd with its own decay_steps": {"schedule": "wsd", "decay_steps": 400},
    "constant after its warm-up": {"min_lr_ratio": 1.0},
    "constant wsd": {"schedule": "wsd", "min_lr_ratio": 1.0},
  }
  for name, fields in cases.items():
    c = config_lib.default_config()
    c.optim.update(fields)
    depends = bool(settings_check.steps_dependence(c))
    same = np.array_equal(_lrs(c.optim, 300, 300), _lrs(c.optim, 600, 300))
    assert depends == (not same), name
  assert settings_check.steps_dependence(config_lib.default_config())  # the default decays over the run
  hybrid = config_lib.default_config("hybrid")
  hybrid.optim.decay_steps = 400
  assert "method 'velocity'" in " ".join(settings_check.steps_dependence(hybrid))  # its steps read the length


def test_a_resume_with_other_steps_is_refused_with_the_fixes():
  c = config_lib.default_config()
  c.optim.update(learning_rate=3e-3, warmup_steps=50)
  c.trainer.steps = 600
  error = settings_check.steps_change_error(c, 300, 300, "runs/x", finished=True)
  assert "finished its 300 steps" in error and "--config.trainer.steps=300 to resume it" in error
  assert "--config.resume=force" in error and "a new --workdir" in error
  # The jump it would make, from the schedules themselves.
  lr_300, lr_600 = _lrs(c.optim, 300, 301)[300], _lrs(c.optim, 600, 301)[300]
  assert lr_600 > 5 * lr_300
  assert f"would be {lr_600:.4g} instead of {lr_300:.4g}" in error
  assert settings_check.steps_change_error(c, 600, 300, "runs/x") is None  # the same steps
  c.optim.decay_steps = 1000
  assert settings_check.steps_change_error(c, 300, 300, "runs/x") is None  # nothing depends on it
  c.trainer.steps = 100  # a checkpoint past the end: nothing to train, whatever resume says
  c.resume = "force"
  assert "past --config.trainer.steps=100" in settings_check.steps_change_error(c, 300, 200, "runs/x")


def _workdir_run(tmp_path, steps, **kw):
  c = rh.mlp_config("baseline", steps=steps)
  c.trainer.update(log_every=10, checkpoint_every=10)
  for k, v in kw.items():
    c.update_from_flattened_dict({k: v})
  return c


@pytest.mark.slow  # five short runs
def test_train_refuses_resuming_with_other_steps_and_force_records_it(tmp_path, capsys):
  workdir = str(tmp_path / "run")
  done = train_lib.train(_workdir_run(tmp_path, 30), workdir, **rh.mlp_task())
  capsys.readouterr()
  # More steps: refused, nothing written.
  with pytest.raises(ValueError, match=r"finished its 30 steps .*--config\.trainer\.steps=30 to resume it"):
    train_lib.train(_workdir_run(tmp_path, 60), workdir, **rh.mlp_task())
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["10", "20", "30"]
  # Fewer steps: the finished run's summary, with its own count.
  again = train_lib.train(_workdir_run(tmp_path, 10), workdir, **rh.mlp_task())
  out = capsys.readouterr().out
  assert again == done and "already finished its 30 steps (--config.trainer.steps=10 asks for no more)" in out
  assert "raise --config.trainer.steps" not in out
  # The same steps: nothing to do, and a larger value is not suggested (it changes the schedule).
  train_lib.train(_workdir_run(tmp_path, 30), workdir, **rh.mlp_task())
  assert "use a new --workdir with a larger --config.trainer.steps" in capsys.readouterr().out
  # resume='force': continued, and recorded in the summary and the checkpoints.
  forced = train_lib.train(_workdir_run(tmp_path, 60, resume="force"), workdir, **rh.mlp_task())
  assert forced["start_step"] == 30 and forced["steps_changes"] == [{"step": 30, "from": 30, "to": 60}]
  assert "WARNING: --config.resume=force" in capsys.readouterr().out
  # A schedule of its own length: more steps continue it, with no force and no record.
  other = str(tmp_path / "fixed")
  train_lib.train(_workdir_run(tmp_path, 30, **{"optim.decay_steps": 60}), other, **rh.mlp_task())
  longer = train_lib.train(_workdir_run(tmp_path, 40, **{"optim.decay_steps": 60}), other, **rh.mlp_task())
  assert longer["start_step"] == 30 and longer["steps"] == 40 and "steps_changes" not in longer


# --- eval_batches and export_params ----------------------------------------------------------------


def test_an_empty_eval_set_is_refused_before_the_workdir_is_made(tmp_path):
  task = {**rh.mlp_task(), "eval_batches": []}
  with pytest.raises(ValueError, match=r"train\(eval_batches=\[\]\).*at least one fixed held-out batch"):
    train_lib.train(rh.mlp_config("baseline", steps=20), str(tmp_path / "run"), **task)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow  # two short runs
def test_export_params_warns_when_the_run_stopped_before_its_end(tmp_path):
  class Stop(Exception):
    pass

  def stop_at_20(step, record):
    if step == 20:
      raise Stop

  workdir = str(tmp_path / "run")
  with pytest.raises(Stop):  # the log at step 20 comes before its checkpoint: the latest is step 10
    train_lib.train(_workdir_run(tmp_path, 30), workdir, hooks={"on_log": stop_at_20}, **rh.mlp_task())
  with pytest.warns(UserWarning, match=r"stopped at step 10 of its 30 \(--config\.trainer\.steps\).*pass step=10"):
    early = hybridjax.export_params(workdir, averaged=False)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    chex.assert_trees_all_equal(hybridjax.export_params(workdir, step=10, averaged=False), early)  # asked for
    train_lib.train(_workdir_run(tmp_path, 30), workdir, **rh.mlp_task())  # finished: no warning
    hybridjax.export_params(workdir, averaged=False)


# --- hybrid settings the run does not read ---------------------------------------------------------


def _errors(c, control=None, references=None):
  c = config_lib.with_method_block(c)
  method = config_lib.resolve_method(c)
  refs = references if references is not None else settings_check.reference_configs(c)
  return settings_check.inert_setting_errors(c, method, refs, control=control)


def test_hybrid_settings_with_no_effect_are_named():
  baseline = hybridjax.default_config()
  assert _errors(baseline) == []
  baseline.hybrid.confidence_threshold = 0.0
  (error,) = _errors(baseline)
  assert error.startswith("--config.hybrid.confidence_threshold=0.0 (default 0.5) has no effect")
  assert "--config.mode=hybrid" in error
  velocity = hybridjax.default_config(mode="hybrid")
  velocity.hybrid.jump.every = 50
  (error,) = _errors(velocity)
  assert "--config.hybrid.jump.every=50" in error and "--config.hybrid.method=jump" in error
  velocity.hybrid.jump.every = 100  # back at its default: nothing to say
  assert _errors(velocity) == []
  jump = hybridjax.default_config(mode="hybrid", method="jump")
  control = registry.load_method("jump").controller_overrides(jump.hybrid, None)
  assert _errors(jump, control) == []
  jump.hybrid.correct_steps = 5
  (error,) = _errors(jump, control)
  assert "--config.hybrid.correct_steps=5 (default 12) has no effect: method 'jump' sets it to 100" in error
  jump.hybrid.correct_steps = 100  # what the method sets anyway
  assert _errors(jump, control) == []
  outer = hybridjax.default_config(mode="hybrid", method="outer_momentum")
  outer.hybrid.enable_predict = True
  assert _errors(outer, {"enable_predict": False}) == []  # the default
  outer.hybrid.enable_predict = False
  assert _errors(outer, {"enable_predict": False}) == []  # the value it sets


def test_every_controller_setting_has_its_config_field():
  names = {f.name for f in dataclasses.fields(ControllerSettings)}
  assert set(settings_check.CONTROL_FIELDS) == names
  flat = config_lib.flatten(config_lib.default_hybrid_config())
  assert all(field in flat for field in settings_check.CONTROL_FIELDS.values())


def test_train_refuses_a_hybrid_setting_the_baseline_ignores_before_the_workdir_is_made(tmp_path):
  c = rh.mlp_config("baseline", steps=20)
  c.hybrid.confidence_threshold = 0.0
  with pytest.raises(ValueError, match=r"--config\.hybrid\.confidence_threshold=0\.0 \(default 0\.5\) has no effect"):
    train_lib.train(c, str(tmp_path / "run"), **rh.mlp_task())
  assert not os.path.exists(tmp_path / "run")


def _user_method_config(path: str):
  c = rh.mlp_config("hybrid", steps=20)
  c.hybrid.velocity = config_lib.default_hybrid_config().velocity  # not read by the user's method
  c.hybrid.method = path
  return config_lib.with_method_block(c)


def test_train_refuses_what_a_user_methods_control_overrides(tmp_path, monkeypatch):
  source = _method_source()
  pkg = tmp_path / "ctl_methods"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "repeat_update.py").write_text(source)
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    c = _user_method_config("ctl_methods.repeat_update")
    c.hybrid.correction_interval = 0  # what its control() sets: no effect lost
    c.hybrid.max_predict_steps = 3  # its control() sets 1
    with pytest.raises(ValueError, match=r"--config\.hybrid\.max_predict_steps=3 \(default 4\) has no effect"):
      train_lib.train(c, str(tmp_path / "run"), **rh.mlp_task())
    assert not os.path.exists(tmp_path / "run")
  finally:
    for name in [n for n in sys.modules if n.startswith("ctl_methods")]:
      del sys.modules[name]


def test_no_gpt2_small_preset_is_refused_and_a_change_on_one_is():
  from experiments import gpt2_small
  from experiments.configs import gpt2_small as presets
  from hybridjax.models import gpt2

  combos = [[]] + [[v] for v in presets.VARIANTS] + [list(presets.VARIANTS)]
  arms = [("baseline", "")] + [("hybrid", m) for m in registry.BUILTIN_METHODS]
  for preset, combo, (mode, name) in itertools.product(gpt2.PRESETS, combos, arms):
    c = presets.get_config(",".join([preset, *combo]))
    c.mode, c.hybrid.method = mode, name
    method = registry.load_method(name or config_lib.DEFAULT_METHOD)
    control = method.controller_overrides(c.hybrid, None) if method.controller_overrides else None
    assert _errors(c, control, gpt2_small.preset_configs(c)) == [], (preset, combo, mode, name)
  c = presets.get_config("tiny,micro")
  c.hybrid.confidence_threshold = 0.0  # baseline mode
  with pytest.raises(ValueError, match=r"--config\.hybrid\.confidence_threshold=0\.0 \(default 0\.5\) has no effect"):
    gpt2_small.run(c, "unused")  # refused before the data is read


# --- misspelt method hooks -------------------------------------------------------------------------


def _method_source() -> str:
  with open(os.path.join(ROOT, "docs", "methods.md"), encoding="utf-8") as f:
    text = f.read()
  return re.search(r"<!-- method-example:start -->\s*```python\n(.*?)```", text, re.S).group(1)


def _module(source: str, name: str = "typo_method") -> types.ModuleType:
  module = types.ModuleType(name)
  exec(compile(source, f"{name}.py", "exec"), module.__dict__)
  return module


def test_a_near_miss_of_an_interface_name_is_named_with_did_you_mean():
  source = _method_source()
  assert "def predict_step(" in source and "ADVANCES_SCHEDULE = " in source
  assert settings_check.misspelt_hook_errors(_module(source), "m") == []  # the example as printed
  typo = source.replace("def predict_step(", "def predict(").replace("ADVANCES_SCHEDULE = ", "ADVANCE_SCHEDULE = ")
  errors = settings_check.misspelt_hook_errors(_module(typo), "m")
  assert len(errors) == 2
  assert "defines ADVANCE_SCHEDULE" in errors[0] and "did you mean ADVANCES_SCHEDULE?" in errors[0]
  assert "defines predict," in errors[1] and "did you mean predict_step?" in errors[1] and "_predict" in errors[1]
  # The registry alone loads it as the baseline's step: what the check is for.
  record = registry.method_record(_module(typo), "m")
  assert record.predict_step is None and not record.advances_schedule
  # A private helper and an imported function are not the module's interface.
  private = typo.replace("def predict(", "def _predict(").replace("ADVANCE_SCHEDULE = ", "_ADVANCE_SCHEDULE = ")
  assert settings_check.misspelt_hook_errors(_module(private + "\nfrom os.path import join as metrics\n"), "m") == []


def test_train_refuses_a_method_with_a_misspelt_hook_before_the_workdir_is_made(tmp_path, monkeypatch):
  typo = _method_source().replace("def predict_step(", "def predict(")
  pkg = tmp_path / "typo_methods"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "repeat_update.py").write_text(typo)
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    c = _user_method_config("typo_methods.repeat_update")
    with pytest.raises(ValueError, match=r"defines predict, .*did you mean predict_step\?"):
      train_lib.train(c, str(tmp_path / "run"), **rh.mlp_task())
    assert not os.path.exists(tmp_path / "run")
  finally:
    for name in [n for n in sys.modules if n.startswith("typo_methods")]:
      del sys.modules[name]
