"""A method written outside the package (docs/methods.md's example, as printed) runs through `train()`:
loaded from its module path, validated, resumed bit-exactly, with no memory growth, and its control
arm moves no weight. No file of the package names it."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
import types

import jax
import pytest
from conftest import ROOT, abstract_driver_state, method_package, restore_checkpoint, straight_and_resumed

import hybridjax
from hybridjax import config as config_lib
from hybridjax import registry
from hybridjax.loop import train as train_lib
from hybridjax.loop.train import check_position
from hybridjax.models import mlp


def method_source() -> str:
  with open(os.path.join(ROOT, "docs", "methods.md"), encoding="utf-8") as f:
    text = f.read()
  m = re.search(r"<!-- method-example:start -->\s*```python\n(.*?)```\s*<!-- method-example:end -->", text, re.S)
  assert m, "docs/methods.md lost its example markers (<!-- method-example:start/end -->)"
  return m.group(1)


def test_the_documented_method_is_complete_in_40_lines():
  source = method_source()
  assert len(source.rstrip("\n").split("\n")) <= 40, "the simplest complete method grew beyond 40 lines"
  record = registry.method_record(_module_from(source), "repeat_update")
  assert record.config_key == "repeat" and dict(record.default_config()) == {"every": 10, "move": True}
  every = {f.name: f for f in record.fields}["every"]
  assert every.check(0) and every.check(3) is None  # the declared checks
  assert record.correct_step is None and record.predict_step is not None  # CORRECT is the real step


def test_the_checks_methods_md_lists_are_the_fields_modules_and_its_float_example_holds():
  """docs/methods.md names every check a method's `CONFIG` imports from `hybridjax.fields` (a float field
  needs `check_num`), and its float field's example takes and refuses what the page says."""
  from hybridjax import fields

  with open(os.path.join(ROOT, "docs", "methods.md"), encoding="utf-8") as f:
    page = " ".join(f.read().split())
  part = page.split("each field's default and its check (`hybridjax.fields`): ")[1].split("* `make_settings`")[0]
  named = set(re.findall(r"`(check_\w+)", part))
  assert named == {n for n in fields.__all__ if n.startswith("check_")}, named
  example = re.search(r'`"scale": \((\S+), (fields\.check_num\([^`]*\))\)`', part)
  check = eval(example.group(2), {"fields": fields})  # noqa: S307 (the page's own expression)
  default = float(example.group(1))
  assert check(default) is None and check(1.0) is None and check(0.0) and check(1.5)
  assert "takes 1.0, refuses 0.0 and 1.5; `check_int` refuses 0.5" in part and fields.check_int()(0.5)


def test_a_method_declares_its_block_as_fields_or_config_and_nothing_else():
  """`FIELDS` (`schema.Field`s) declares the same block as docs/methods.md's `CONFIG`, with docs; a block
  declared twice, as a {field: check} dict, or by `default_config()` is refused naming the fix."""
  from hybridjax import schema

  source = method_source()
  config_line = next(line for line in source.splitlines() if line.startswith("CONFIG = "))
  fields = (
    "from hybridjax import schema\n"
    "FIELDS = (schema.Field('every', 10, schema.check_int(1), 'real steps between repeats'),"
    " schema.Field('move', True, schema.check_bool, 'False: the control arm'))"
  )
  declared = registry.method_record(_module_from(source.replace(config_line, fields)), "repeat_update")
  adapted = registry.method_record(_module_from(source), "repeat_update")
  assert declared.default_config() == adapted.default_config()
  assert [(f.name, f.default) for f in declared.fields] == [(f.name, f.default) for f in adapted.fields]
  assert declared.fields[0].doc == "real steps between repeats" and isinstance(adapted.fields[0], schema.Field)
  imported = source.replace(config_line, config_line + "\nfrom hybridjax.config import default_config")
  assert registry.method_record(_module_from(imported), "repeat_update").default_config() == adapted.default_config()
  for wrong, fix in (
    (config_line + "\n" + fields, "CONFIG and FIELDS both declare the block: keep one"),
    ("FIELDS = {'every': fields.check_int(1)}", "FIELDS must be a tuple of"),
    ("def default_config():\n  return None", r"default_config\(\) is no longer read: declare the block's fields"),
  ):
    with pytest.raises(ValueError, match=fix):
      registry.method_record(_module_from(source.replace(config_line, wrong)), "repeat_update")


def _module_from(source: str):
  module = types.ModuleType("repeat_update")
  exec(compile(source, "repeat_update.py", "exec"), module.__dict__)
  return module


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
  """docs/methods.md's method, written to a module of a package outside hybridjax."""
  with method_package(tmp_path, monkeypatch, "user_methods", method_source()) as path:
    yield path


def _task():
  model = mlp.MLP(features=(16,), n_out=1)
  x, y = mlp.make_regression_problem(0, n_in=4, n=256)
  return dict(
    init_params=lambda rng: model.init(rng, x[:1])["params"],
    loss_fn=mlp.make_loss_fn(model),
    train_batch=lambda i: mlp.regression_batch(x[:192], y[:192], i, 32, seed=0),
    eval_batches=[{"x": x[192:], "y": y[192:]}],
  )


def _config(method: str, steps: int = 60):
  c = config_lib.default_config("hybrid")
  c.hybrid.method = method
  c.hybrid.update(warmup_steps=10, full_steps=5)
  c.trainer.update(steps=steps, progress=False, log_every=10, eval_every=0, checkpoint_every=20, averaging="ema")
  c.trainer.update(batch_size=32, eval_batches=1)  # what _task gives
  c.optim.update(learning_rate=1e-2, warmup_steps=5)
  return c


def _run(config, workdir, hooks=None):
  return hybridjax.train(config, str(workdir), hooks=hooks, **_task())


def _restore(workdir, config):
  step, state, _ = restore_checkpoint(workdir, abstract_driver_state(config_lib.with_method_block(config), _task()))
  return step, state


@pytest.mark.slow
def test_a_method_from_a_user_module_trains_resumes_and_has_a_control(user_module, tmp_path, monkeypatch):
  import conftest

  monkeypatch.setattr(conftest, "run_experiment", _run)
  monkeypatch.setattr(conftest, "restore_latest", _restore)
  c = _config(user_module)
  # Resumed from step 20, bit for bit, the method's own buffer included.
  straight, resumed, a = straight_and_resumed(c, tmp_path, stop_after=30)
  # It predicted: every `every` (10) real steps one repeat, which used no batch and no backward pass.
  assert straight["phase_steps"]["PREDICT"] == 5 and straight["method"] == "repeat_update"
  assert straight["batches"] == straight["backward_passes"] == 60 - 5
  assert straight["memory"]["growth_bytes"] == 0
  assert jax.tree.structure(a.method) == jax.tree.structure(a.train.params)
  # The control arm: the same decisions (the same schedule, batches and passes), no weight moved by a repeat.
  from hybridjax.bench import arms as arms_lib

  method = registry.load_method(user_module)
  control = config_lib.with_method_block(_config(user_module))
  control.hybrid.update_from_flattened_dict(arms_lib.declared(method, "CONTROL"))
  same = _run(control, tmp_path / "control")
  assert (same["phase_steps"], same["batches"], same["backward_passes"]) == (
    straight["phase_steps"],
    straight["batches"],
    straight["backward_passes"],
  )
  assert same["final_eval_loss"] != straight["final_eval_loss"]


def test_a_bad_user_method_gets_a_named_error(user_module, tmp_path):
  c = _config(user_module)
  c.hybrid.method = "user_methods.no_such_method"
  with pytest.raises(ValueError, match=r"hybrid\.method='user_methods\.no_such_method' names no method"):
    _run(c, tmp_path / "a")
  (tmp_path / "user_methods" / "half.py").write_text(
    "NAME = 'half'\ndef full_step(ctx, state, batch, schedule):\n  return state\n"
  )
  c.hybrid.method = "user_methods.half"
  with pytest.raises(ValueError, match=r"is not a method: it defines no make_settings; it defines no init"):
    _run(c, tmp_path / "b")
  # A method written against the earlier name of the real transition would train the baseline's step.
  (tmp_path / "user_methods" / "old_name.py").write_text(method_source().replace("def full_step(", "def real_step("))
  c.hybrid.method = "user_methods.old_name"
  with pytest.raises(
    ValueError, match=r"it defines real_step, the earlier name of the real transition: rename it full_step"
  ):
    _run(c, tmp_path / "d")
  c = _config(user_module)
  with c.unlocked():  # the method's block, set from Python by its owner
    c.hybrid.repeat = config_lib.ml_collections.ConfigDict({"every": 0, "move": True})
  with pytest.raises(ValueError, match=r"hybrid\.repeat\.every must be >= 1"):
    _run(c, tmp_path / "c")
  assert not os.path.exists(tmp_path / "c" / "checkpoints")


@pytest.mark.slow  # an end-to-end run; CI runs it (`-m ""`)
def test_a_user_method_and_task_get_the_protocols_verdict(user_module, tmp_path, jax_cache):
  """The `quick` protocol on a task and a method of the user's, with the method's control arm: a
  verdict from the package's benchmark, with no file of it edited."""
  from experiments import benchmark
  from experiments.configs import benchmark as benchmark_cfg

  # The user's task: the MLP regression, from a module of theirs.
  (tmp_path / "user_methods" / "task.py").write_text(
    "from hybridjax.tasks import mlp\n\ndef build_task(config):\n  return mlp.build_task(config)\n"
  )
  c = benchmark_cfg.get_config("quick")
  with c.unlocked():
    del c.model, c.data  # the GPT-2 task's blocks, which the user's task does not read
  c.trainer.update(steps=40, batch_size=16, eval_batches=4, compile_cache_dir=jax_cache)
  c.optim.learning_rate = 0.01
  c.benchmark.update(task="user_methods.task", methods="repeat,repeat_control", timing_rounds=2, timing_steps=5)
  c.benchmark.arms = config_lib.ml_collections.ConfigDict(
    {
      "repeat": {"method": user_module},
      "repeat_control": {"method": user_module, "control": True, "control_of": "repeat"},
    }
  )
  result = benchmark.run_benchmark(c, str(tmp_path / "bench"))
  runs = result["method_runs"]
  assert set(runs) == {"repeat", "repeat_control"} and result["task"] == "user_methods.task"
  for arm in runs.values():
    for run in arm.values():
      # Every 10 real steps one repeat: a step kind of its own, no backward pass, no batch.
      assert run["step_kinds"]["predict_step"] > 0
      assert run["backward_passes"] == sum(run["step_kinds"].values()) - run["step_kinds"]["predict_step"]
  f = result["figures"]["repeat"]
  assert "vs_skip_control" in f and f["vs_skip_control"]["verdict"] in ("lower", "higher", "no difference")
  for anchor in ("baseline", "averaged_baseline"):
    assert f[anchor]["backward_ratio"]["mean"] is not None
  assert os.path.exists(tmp_path / "bench" / "results.md")


def test_train_resolves_the_method_once_and_passes_its_record_down(user_module, tmp_path, monkeypatch):
  """`train()` looks its method up by name once: the config's checks, the driver's context and the
  batches per step all get that record. (The built-in methods are loaded too, for the table of the
  config's declared fields that the unknown-key check reads.)"""
  config = _config(user_module, steps=24)
  calls = []
  load = registry.load_method
  monkeypatch.setattr(registry, "load_method", lambda name: calls.append(name) or load(name))
  summary = _run(config, tmp_path / "run")
  own = [name for name in calls if name not in registry.BUILTIN_METHODS]
  assert own == [user_module] and summary["method"] == "repeat_update"
  assert summary["phase_steps"]["PREDICT"] >= 1  # the method ran


# --- the documented command lines, as printed ------------------------------------------------------


def _doc_command(page: str, program: str) -> list[str]:
  """The first `python -m <program>` command of docs/<page> (its bash block, continuation lines
  joined), as argv."""
  import shlex

  with open(os.path.join(ROOT, "docs", page), encoding="utf-8") as f:
    text = f.read()
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    joined = re.sub(r"\\\n\s*", " ", block)
    for line in joined.splitlines():
      line = line.strip()
      if line.startswith(f"python -m {program} ") and "my_pkg.repeat_update" in line:
        return shlex.split(line)
  raise AssertionError(f"docs/{page} lost its `python -m {program} ... my_pkg.repeat_update` command")


def _run_documented(argv: list[str], tmp_path, workdir_flag: str) -> subprocess.CompletedProcess:
  pkg = tmp_path / "users" / "my_pkg"
  pkg.mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "repeat_update.py").write_text(method_source())
  env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'users'}{os.pathsep}{ROOT}", JAX_PLATFORMS="cpu")
  cmd = [sys.executable, *argv[1:], workdir_flag]
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


def test_a_module_path_in_benchmark_methods_is_the_methods_arm_and_its_control(user_module):
  from experiments.configs import benchmark as benchmark_cfg
  from hybridjax.bench import arms as arms_lib

  c = benchmark_cfg.get_config("quick")
  c.benchmark.methods = f"jump,{user_module}"
  assert arms_lib.selected(c) == ["jump", "repeat_update", "repeat_update_control"]
  defined = arms_lib.arms(c)
  assert defined["repeat_update"].method == user_module and not defined["repeat_update"].control
  assert defined["repeat_update_control"].control and defined["repeat_update_control"].control_of == "repeat_update"
  c.benchmark.methods = "user_methods.nothing_here"
  with pytest.raises(ValueError, match=r"--config\.benchmark\.methods=.*module path of a method of yours"):
    arms_lib.selected(c)


def _user_method(tmp_path, name: str, control: str) -> str:
  """docs/methods.md's method as module `user_methods.<name>`, with its CONTROL line set to `control`."""
  source = method_source()
  line = 'CONTROL = {"repeat.move": False}'
  assert line in source
  (tmp_path / "user_methods" / f"{name}.py").write_text(source.replace(line, f"CONTROL = {control}"))
  return f"user_methods.{name}"


def test_a_control_arm_that_is_not_a_valid_run_or_changes_nothing_is_refused(user_module, tmp_path):
  """A method's control arm is built and validated with the config before anything runs: a CONTROL that
  leaves the run as the method's own (the report would compare the method with itself), an empty one, a
  misspelt key, a key written with 'hybrid.' (once a raw KeyError when the control's run started) are
  refused, naming the arm, the method's module and its CONTROL, and the fix; the documented one passes."""
  from experiments.configs import benchmark as benchmark_cfg
  from hybridjax.bench import arms as arms_lib
  from hybridjax.bench import specs

  c = benchmark_cfg.get_config("quick")
  c.benchmark.methods = user_module
  specs.validate_benchmark(c)
  cases = {
    "noop": ('{"repeat.move": True}', r"CONTROL = \{'repeat.move': True\} leaves the run config as the method's own"),
    "empty": ("{}", r"declares CONTROL = \{\}, a control arm that changes nothing: give CONTROL in user_methods.empty"),
    "misspelt": (
      '{"repeat.mov": False}',
      r"CONTROL = \{'repeat.mov': False\} makes no valid run: .*did you mean --config.hybrid.repeat.move\?.*"
      r"Fix CONTROL in user_methods.misspelt",
    ),
    "prefixed": (
      '{"hybrid.repeat.move": False}',
      r"CONTROL = \{'hybrid.repeat.move': False\} sets a field config.hybrid does not have .*without 'hybrid.'",
    ),
  }
  for name, (control, message) in cases.items():
    c.benchmark.methods = _user_method(tmp_path, name, control)
    with pytest.raises(ValueError, match=message):
      specs.validate_benchmark(c)
  # The arm's own run (a spec built without the check) names the module and the fix, not a KeyError.
  c.benchmark.methods = "user_methods.prefixed"
  with pytest.raises(ValueError, match=r"user_methods.prefixed's CONTROL .* fix CONTROL in user_methods.prefixed"):
    specs.run_spec(c, kind="method", seed=1, lr=1e-3, steps=10, beta=0.9, method="repeat_update_control")
  # An arm of benchmark.arms is named by its field.
  c.benchmark.methods = "mine"
  c.benchmark.arms.mine = {"method": "user_methods.noop", "control": True}
  with pytest.raises(
    ValueError, match=r"--config\.benchmark\.arms\.mine, the control arm of method 'user_methods.noop'"
  ):
    specs.validate_benchmark(c)
  assert "mine" in arms_lib.arms(c)


def test_a_baseline_mode_arm_of_a_method_with_its_own_steps_is_refused(user_module):
  """mode='baseline' runs the baseline loop's step: an arm of a method that defines its own transitions
  (the user's method, the jump) would train the plain baseline under the method's name, so it is refused,
  naming the field and the fix; outer momentum, whose steps are the baseline's, keeps its baseline arm."""
  from experiments.configs import benchmark as benchmark_cfg
  from hybridjax.bench import specs

  c = benchmark_cfg.get_config("quick")
  assert c.benchmark.arms.outer_momentum.mode == "baseline"
  c.benchmark.methods = "outer_momentum"
  specs.validate_benchmark(c)
  for method, own in ((user_module, "full_step, predict_step"), ("jump", "full_step, predict_step")):
    c.benchmark.arms.mine = {"method": method, "mode": "baseline"}
    c.benchmark.methods = "mine"
    with pytest.raises(
      ValueError,
      match=rf"--config\.benchmark\.arms\.mine\.mode='baseline' trains the baseline loop's own steps, but method "
      rf"'{method}' defines its own \({own}\): .*set --config\.benchmark\.arms\.mine\.mode=hybrid",
    ):
      specs.validate_benchmark(c)


def test_an_arm_predicts_unless_its_method_never_predicts_by_design(user_module):
  """`arms.predicts`, which decides whether an arm whose runs predicted no step is marked not exercised:
  the velocity arms, the jump arms and a user's method with a `predict_step`, not outer momentum (in
  either mode) nor selective backprop, which define no `predict_step` (their every step is real)."""
  from experiments.configs import benchmark as benchmark_cfg
  from hybridjax.bench import arms as arms_lib

  c = benchmark_cfg.get_config("quick")
  c.benchmark.methods = user_module
  defined = arms_lib.arms(c)
  predicting = {name for name, arm in defined.items() if arms_lib.predicts(arm)}
  assert predicting == set(defined) - {"outer_momentum", "selective", "selective_control"}
  assert {"hybrid", "velocity_control", "jump", "repeat_update", "repeat_update_control"} <= predicting
  assert not arms_lib.predicts(arms_lib.Arm(name="om", method="outer_momentum"))


@pytest.mark.slow  # trains through the command line; CI runs it
def test_the_training_command_of_methods_md_runs_as_printed(tmp_path):
  argv = _doc_command("methods.md", "experiments.gpt2_small")
  r = _run_documented(argv, tmp_path, f"--workdir={tmp_path / 'run'}")
  assert r.returncode == 0, r.stderr[-3000:]
  import json

  with open(tmp_path / "run" / "summary.json") as f:
    summary = json.load(f)
  assert summary["method"] == "repeat_update" and summary["phase_steps"]["PREDICT"] >= 1


@pytest.mark.slow  # the quick protocol through the command line; CI runs it
def test_the_benchmark_command_of_benchmark_md_runs_as_printed(tmp_path):
  argv = _doc_command("benchmark.md", "experiments.benchmark")
  r = _run_documented(argv, tmp_path, f"--workdir={tmp_path / 'bench'}")
  assert r.returncode == 0, r.stderr[-3000:]
  import json

  with open(tmp_path / "bench" / "benchmark.json") as f:
    result = json.load(f)
  assert set(result["method_runs"]) == {"repeat_update", "repeat_update_control"}


# --- a user's mistakes, caught before the workdir is made -------------------------------------------


def _broken(user_module, tmp_path, old: str, new: str) -> str:
  source = method_source()
  assert old in source
  name = f"broken_{abs(hash(new)) % 10**6}"
  (tmp_path / "user_methods" / f"{name}.py").write_text(source.replace(old, new))
  return f"user_methods.{name}"


@pytest.mark.parametrize(
  "old,new,message",
  [
    (  # a real step that returns only the state
      "state.method)), info",
      "state.method))",
      r"full_step must return \(state, StepInfo\) as full_step\(ctx, state, batch, schedule\) -> "
      r"\(state, StepInfo\); it returned a HybridState",
    ),
    (  # a predicted step whose alpha is a scalar, not one entry per parameter group
      "alpha=jax.numpy.full(ctx.groups.n_groups, scale)",
      "alpha=scale",
      r"predict_step returns a StepInfo whose alpha is shape \(\) float32 where the step's is shape \(4,\) "
      r"float32: .*ctx\.groups\.n_groups = 4",
    ),
    (  # a predicted step without the schedule argument
      "def predict_step(ctx, state, batch, schedule):",
      "def predict_step(ctx, state, batch):",
      r"predict_step\(ctx, state, batch\) cannot be called as predict_step\(ctx, state, batch, schedule\)",
    ),
  ],
)
def test_a_hook_with_the_wrong_signature_or_return_is_refused_before_the_workdir(
  user_module, tmp_path, old, new, message
):
  config = _config(_broken(user_module, tmp_path, old, new), steps=24)
  with pytest.raises(ValueError, match=message):
    _run(config, tmp_path / "run")
  assert not os.path.exists(tmp_path / "run")


def test_a_prepared_correct_step_whose_prepare_returns_a_step_is_refused_before_the_workdir(user_module, tmp_path):
  # The fused step runs a Prepared transition's prepare alone, carrying the state: one that returns
  # (state, StepInfo), as a transition does, would fail there with a raw JAX carry error.
  name = "prepared_returns_info"
  source = method_source() + (
    "\n\nfrom hybridjax.hybrid.real_step import baseline_step\nfrom hybridjax.hybrid.step import Prepared\n\n\n"
    "def _roll_back(ctx, state, batch, schedule):\n"
    "  return predict_step(ctx, state, batch, schedule)\n\n\n"
    "correct_step = Prepared(_roll_back, baseline_step)\n"
  )
  (tmp_path / "user_methods" / f"{name}.py").write_text(source)
  message = r"correct_step's Prepared\.prepare must return the HybridState.*returned a tuple"
  with pytest.raises(ValueError, match=message):
    _run(_config(f"user_methods.{name}", steps=24), tmp_path / "run")
  assert not os.path.exists(tmp_path / "run")


def _with_extra(tmp_path, name: str, initial: str, returned: str, full_step: bool = True) -> str:
  """docs/methods.md's method with a `step_extra` of {'n': `initial`} whose transitions return
  {'n': `returned`} (without its `full_step` when `full_step` is False: the baseline's real step)."""
  source = method_source()
  source = source.replace("state.method)), info", f"state.method)), info.replace(extra={{'n': {returned}}})")
  source = source.replace("batch_consumed=False)", f"batch_consumed=False, extra={{'n': {returned}}})")
  if not full_step:
    source = source.replace("def full_step(", "def _unused_full_step(")
  source += f"\n\ndef step_extra(ctx):\n  return {{'n': {initial}}}\n"
  (tmp_path / "user_methods" / f"{name}.py").write_text(source)
  return f"user_methods.{name}"


def _hybrid_driver(config):
  from hybridjax.loop import train as train_lib

  method = config_lib.resolve_method(config)
  config = config_lib.with_method_block(config, method)
  task = _task()
  driver = train_lib.make_driver(config, init_params=task["init_params"], loss_fn=task["loss_fn"], method=method)
  return driver, task["train_batch"](0)


@pytest.mark.parametrize(
  "initial, returned, message",
  [
    ("0", "jax.numpy.float32(1.0)", None),  # a Python scalar: the fused step's loop promotes it to float32
    (
      "0.0",
      "jax.numpy.int32(1)",
      r"full_step returns a StepInfo whose extra\['n'\] is shape \(\) int32 where the "
      r"step's is shape \(\) float32",
    ),  # a float the loop cannot make an int
    (
      "jax.numpy.zeros(())",
      "jax.numpy.zeros(3)",
      r"full_step returns a StepInfo whose extra\['n'\] is shape \(3,\) "
      r"float32 where the step's is shape \(\) float32",
    ),
  ],
)
def test_a_step_extra_is_checked_as_the_fused_step_carries_it(user_module, tmp_path, initial, returned, message):
  # The check agrees with the fused step's while_loop both ways: what the loop accepts (a weakly typed
  # initial value it promotes) passes, what it refuses is refused, naming the leaf and both shapes.
  from hybridjax.hybrid import step as step_lib

  name = f"extra_{abs(hash((initial, returned))) % 10**6}"
  driver, batch = _hybrid_driver(_config(_with_extra(tmp_path, name, initial, returned)))

  def fused_step():
    return jax.eval_shape(
      functools.partial(step_lib.hybrid_step, driver.ctx), driver.abstract_state(), batch, driver.schedule
    )

  if message is None:
    driver.check_method_hooks(batch)
    fused_step()
  else:
    with pytest.raises(ValueError, match=message):
      driver.check_method_hooks(batch)
    with pytest.raises(TypeError, match="while_loop body function carry input and carry output"):
      fused_step()


def test_a_step_extra_the_default_full_step_does_not_return_is_refused_before_the_workdir(user_module, tmp_path):
  # Without a full_step of its own the method's real steps are baseline_step, whose StepInfo has no
  # extra: the fused step, selecting between it and the predicted step, failed with a raw carry error.
  module = _with_extra(tmp_path, "no_full_step", "jax.numpy.float32(0.0)", "jax.numpy.float32(1.0)", full_step=False)
  message = (
    r"method 'repeat_update' \(user_methods\.no_full_step\) defines step_extra but no full_step, so its real "
    r"steps are the baseline's .*whose StepInfo's extra is None where the step's is the tree PyTreeDef\(\{'n': \*\}\)"
    r".*Define full_step"
  )
  with pytest.raises(ValueError, match=message):
    _run(_config(module, steps=24), tmp_path / "run")
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
  "old,new,message",
  [
    ('NAME = "repeat_update"', 'NAME = "velocity"', r"declares NAME = 'velocity', the built-in method's name"),
    (
      'CONFIG_KEY = "repeat"',
      'CONFIG_KEY = "jump"',
      r"declares CONFIG_KEY = 'jump', the block of the built-in method 'jump' \(--config\.hybrid\.jump\.\*\)",
    ),
  ],
)
def test_a_user_method_named_as_a_built_in_is_refused_before_the_workdir(user_module, tmp_path, old, new, message):
  # As a built-in's name, the run's record and summary would say the built-in trained; as its block,
  # the two methods' fields would mix.
  module = _broken(user_module, tmp_path, old, new)
  if "CONFIG_KEY" in old:  # the module reads its block under the new key
    (tmp_path / "user_methods" / f"{module.split('.')[1]}.py").write_text(
      method_source().replace(old, new).replace("hybrid.repeat.", "hybrid.jump.")
    )
  with pytest.raises(ValueError, match=message):
    _run(_config(module, steps=24), tmp_path / "run")
  assert not os.path.exists(tmp_path / "run")


def test_a_step_that_leaves_its_batch_needs_advances_schedule():
  """Without ADVANCES_SCHEDULE the loop counts one schedule step and one batch per step: a device
  position that differs (a step that left its batch, or advanced the schedule by other than one) is
  refused, naming the module and the fix; an equal one passes."""
  method = registry.method_record(_module_from(method_source()), "repeat_update")
  check_position(method, (24, 24), (24, 24))
  with pytest.raises(
    ValueError,
    match=r"method 'repeat_update' \(repeat_update\): after 20 steps the device holds schedule step "
    r"20 and 18 batches used, where the loop counted 20 and 20 .* needs ADVANCES_SCHEDULE = True in "
    r"repeat_update;",
  ):
    check_position(method, (20, 18), (20, 20))
  with pytest.raises(ValueError, match=r"device holds schedule step 17 .* optim\.moved_train_state"):
    check_position(method, (17, 17), (20, 20))


@pytest.mark.slow  # trains 24 steps; CI runs it (`-m ""`)
def test_a_method_that_leaves_batches_without_advances_schedule_is_stopped(user_module, tmp_path):
  # docs/methods.md's method leaves its batch on a repeat; without ADVANCES_SCHEDULE the loop would
  # skip that batch and train on others than the method chose, with no sign of it.
  config = _config(_broken(user_module, tmp_path, "ADVANCES_SCHEDULE = True", "_ADVANCES = True"), steps=24)
  config.trainer.checkpoint_every = 0
  with pytest.raises(ValueError, match=r"where the loop counted 20 and 20 .* needs ADVANCES_SCHEDULE = True"):
    _run(config, tmp_path / "run")


def test_a_loss_fn_without_aux_is_refused_before_the_workdir(tmp_path):
  model = mlp.MLP(features=(16,), n_out=1)
  x, y = mlp.make_regression_problem(0, n_in=4, n=256)

  def loss_alone(params, batch):
    return ((model.apply({"params": params}, batch["x"]) - batch["y"]) ** 2).mean()

  config = hybridjax.default_config()
  config.trainer.update(steps=10, progress=False)
  config.optim.warmup_steps = 2  # the default 50 is refused on a 10-step run
  with pytest.raises(ValueError, match=r"loss_fn must be loss_fn\(params, batch\) -> \(loss, aux\).*an array of shape"):
    hybridjax.train(
      config,
      str(tmp_path / "run"),
      init_params=lambda rng: model.init(rng, x[:1])["params"],
      loss_fn=loss_alone,
      train_batch=lambda step: mlp.regression_batch(x, y, step, 32, seed=0),
      eval_batches=[{"x": x[:32], "y": y[:32]}],
    )
  assert not os.path.exists(tmp_path / "run")


def test_a_user_method_without_a_block_shares_none_with_a_built_in():
  # outer_momentum has no block either: two methods without one share nothing.
  source = method_source()
  module = _module_from(source)
  method = registry.method_record(module, "repeat_update")
  assert registry.builtin_name_errors(dataclasses.replace(method, config_key=None)) == []
  assert registry.builtin_name_errors(method) == []


def test_a_misspelt_method_name_is_refused_with_the_name_it_resembles(tmp_path):
  c = config_lib.default_config("hybrid")
  c.hybrid.method = "velocty"
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    train_lib.train(c, str(workdir), init_params=None, loss_fn=None, train_batch=None, eval_batches=[])
  assert str(e.value).startswith(
    "--config.hybrid.method='velocty' names no method (did you mean 'velocity'?): use a built-in one (velocity, "
  ), e.value
  assert not workdir.exists()
  # A name that resembles none gets no guess.
  c.hybrid.method = "zzz"
  with pytest.raises(ValueError, match=r"method='zzz' names no method: use a built-in one"):
    train_lib.train(c, str(workdir), init_params=None, loss_fn=None, train_batch=None, eval_batches=[])
