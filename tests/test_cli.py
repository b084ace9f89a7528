"""The command-line programs (hybridjax.cli, `python -m experiments.gpt2_small`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hybridjax import cli, preflight
from hybridjax.loop.train import TrainingDiverged, TrainingInterrupted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args, timeout=120):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, "-m", "experiments.gpt2_small", *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
  )


def test_a_misspelt_override_is_refused_before_the_flags_apply_it():
  """`prepare_for_overrides`, as the command line's config parser calls it: a misspelt field names the
  nearest one; a method's field exists once `--config.hybrid.method` names the method."""
  from experiments.configs import gpt2_small

  with pytest.raises(
    ValueError, match=r"--config\.trainer\.stepz is not a field of the config: did you mean --config\.trainer\.steps\?"
  ):
    cli.prepare_for_overrides(gpt2_small.get_config("tiny"), ["prog", "--config.trainer.stepz=5"])
  with pytest.raises(ValueError, match=r"once --config\.hybrid\.method names the method that declares 'jump2'"):
    cli.prepare_for_overrides(gpt2_small.get_config("tiny"), ["prog", "--config.hybrid.jump2.every=5"])
  c = cli.prepare_for_overrides(
    gpt2_small.get_config("tiny"), ["prog", "--config.hybrid.method=jump", "--config.hybrid.jump.every=5"]
  )
  assert c.hybrid.method == "jump"
  # In the benchmark, which refuses --config.hybrid.method, a method's fields are an arm's overrides.
  from experiments.configs import benchmark as benchmark_cfg

  with pytest.raises(
    ValueError,
    match=r"--config\.hybrid\.jump2\.every is not a field of the config: did you mean --config\.hybrid\.jump\.every\? "
    r"\(an arm's: --config\.benchmark\.arms\.<arm>\.overrides\.hybrid\.jump2\.every\)",
  ):
    cli.prepare_for_overrides(
      benchmark_cfg.get_config("quick"), ["prog", "--config.hybrid.jump2.every=5"], benchmark_cfg.prepare_overrides
    )
  # A field's initials name it (`optim.lr`: `optim.learning_rate`), before a near spelling (`optim.b2`).
  with pytest.raises(
    ValueError, match=r"--config\.optim\.lr is not a field of the config: did you mean --config\.optim\.learning_rate\?"
  ):
    cli.prepare_for_overrides(gpt2_small.get_config("tiny"), ["prog", "--config.optim.lr=1e-3"])
  # With no near name, the fields of the block it names.
  with pytest.raises(
    ValueError, match=r"--config\.data\.qqqqqqq is not a field of the config: the data block holds \["
  ):
    cli.prepare_for_overrides(gpt2_small.get_config("tiny"), ["prog", "--config.data.qqqqqqq=5"])


@pytest.mark.slow  # five programs started; the default suite checks the messages in process (above)
def test_cli_mistakes_print_the_message_and_exit_2(tmp_path):
  """A misspelt key, a value of the wrong type, a bad value, a method with no hybrid mode, a
  method's field before its method is named and a run shorter than the default warm-up: each the
  message (field named, fix given), exit 2, no traceback, nothing written."""
  cases = [
    (("--config.trainer.stepz=5",), "--config.trainer.stepz is not a field of the config: did you mean "),
    (("--config.trainer.steps=abc",), "--config.trainer.steps=abc"),
    (("--config.trainer.steps=-3",), "--config.trainer.steps"),
    (("--config.hybrid.method=jump",), "--config.mode='baseline' trains the plain baseline"),
    (("--config.hybrid.repeat.every=5",), "once --config.hybrid.method names the method"),
    (("--config.trainer.steps=20",), "--config.optim.warmup_steps (50) is at least the run's length"),
  ]
  for i, (args, message) in enumerate(cases):
    r = _cli(*args, f"--workdir={tmp_path}/{i}")
    assert r.returncode == 2, (args, r.returncode, r.stderr[-2000:])
    assert message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
    assert not os.path.exists(tmp_path / str(i))  # failed before anything was written


def test_cli_missing_corpus(tmp_path):
  r = _cli(f"--config.data.path={tmp_path}/nope.txt", f"--workdir={tmp_path}/c")
  assert r.returncode == 2 and "data.path" in r.stderr


@pytest.mark.parametrize(
  "error,code",
  [
    (ValueError("bad --config.x"), 2),
    (FileNotFoundError("no such file"), 2),
    (TrainingDiverged("training diverged: nan"), 3),
  ],
)
def test_run_as_program_turns_errors_into_exit_codes(error, code, capsys, monkeypatch):
  monkeypatch.delenv("HYBRIDJAX_TRACEBACK", raising=False)

  def work():
    raise error

  with pytest.raises(SystemExit) as e:
    cli.run_as_program(work)
  assert e.value.code == code
  assert capsys.readouterr().err.startswith(f"error: {error}")
  monkeypatch.setenv("HYBRIDJAX_TRACEBACK", "1")
  with pytest.raises(type(error)):
    cli.run_as_program(work)


def test_run_as_program_passes_other_errors_and_success(monkeypatch):
  monkeypatch.delenv("HYBRIDJAX_TRACEBACK", raising=False)
  done = []
  cli.run_as_program(lambda: done.append(1))
  assert done == [1]
  with pytest.raises(KeyError):
    cli.run_as_program(lambda: {}["x"])


def test_default_workdir_names_preset_and_mode():
  from conftest import micro_config

  c = micro_config("hybrid")  # the preset with its variant: 'tiny,micro'
  path = cli.default_workdir(c)
  assert path.startswith(os.path.join("runs", "tiny-micro-hybrid-"))
  assert cli.default_workdir(c, "benchmark").startswith(os.path.join("runs", "tiny-micro-benchmark-"))


@pytest.mark.parametrize("signum,code", [(15, 143), (2, 130)])
def test_an_interrupted_run_exits_with_the_signals_status_and_says_where_it_is_saved(signum, code, capsys):
  def work():
    raise TrainingInterrupted(signum, 40, True, "runs/x")

  with pytest.raises(SystemExit) as e:
    cli.run_as_program(work)
  assert e.value.code == code
  assert "the state at step 40 is saved in runs/x: run the same command to resume it" in capsys.readouterr().err

  def ctrl_c():
    raise KeyboardInterrupt()

  with pytest.raises(SystemExit) as e:
    cli.run_as_program(ctrl_c)
  assert e.value.code == 130 and "interrupted" in capsys.readouterr().err


def _parsed(monkeypatch, default, *overrides):
  """The `--config` flag's config as a program parses it (`cli.parse_flags`' two steps, on flags of its
  own): the file's config, the overrides, then the file's `after_command_line` (`cli.finish_config`)."""
  from absl import flags
  from ml_collections.config_flags import config_flags as config_flags_impl

  argv = ["prog", f"--config={default}", *overrides]
  monkeypatch.setattr(sys, "argv", argv)  # config_flags and the parser read the overrides there
  flag_values = flags.FlagValues()
  flag = config_flags_impl._ConfigFlag(  # noqa: SLF001 (as `cli.define_flags` builds it)
    parser=cli._ConfigFileParser(name="config", lock_config=False),  # noqa: SLF001
    serializer=flags.ArgumentSerializer(),
    name="config",
    default=default,
    help_string="",
    flag_values=flag_values,
  )
  flags.DEFINE_flag(flag, flag_values)
  flag_values(argv)
  cli.finish_config(argv, flag_values)
  return flag_values["config"].value


def test_the_speedrun_presets_derived_values_follow_the_command_line(monkeypatch):
  """`tiny,speedrun`: the tricks apply again after the overrides, so the momentum warm-up is the
  recipe's share of the overridden run, the attention scale and the value-embedding tables follow the
  overridden heads and layers; a field the command line set keeps its value, and so does the rest."""
  from experiments.configs import gpt2_small
  from hybridjax import config as config_lib
  from hybridjax.bench import speedrun

  path = os.path.join(ROOT, "experiments", "configs", "gpt2_small.py")
  c = _parsed(monkeypatch, f"{path}:tiny,speedrun", "--config.trainer.steps=3000")
  assert c.optim.muon_momentum_warmup_steps == round(speedrun.MOMENTUM_WARMUP_FRACTION * 3000) == 469
  c = _parsed(monkeypatch, f"{path}:tiny,speedrun", "--config.model.n_head=2", "--config.model.n_layer=8")
  assert c.model.attn_scale == speedrun.RECORD_SCORE_BOUND / (c.model.d_model // 2) and c.model.value_embeds == 2
  c = _parsed(monkeypatch, f"{path}:tiny,speedrun", "--config.trainer.steps=20")
  assert c.optim.muon_momentum_warmup_steps == 3  # the recipe's share of 20 steps: the run is valid
  preflight.validate(c)
  c = _parsed(monkeypatch, f"{path}:tiny,speedrun", "--config.trainer.steps=3000", "--config.model.attn_scale=0.3")
  assert c.model.attn_scale == 0.3  # set on the command line: kept over the trick
  as_given = config_lib.flatten(_parsed(monkeypatch, f"{path}:tiny,speedrun"))
  assert as_given == config_lib.flatten(gpt2_small.get_config("tiny,speedrun"))  # no override: the preset
  c = _parsed(monkeypatch, f"{path}:tiny", "--config.trainer.steps=3000")
  assert c.optim.muon_momentum_warmup_steps == 0  # no speedrun: nothing applied


def test_a_config_files_refusal_after_the_command_line_exits_2_with_its_message(monkeypatch, capsys):
  """A file's `after_command_line` raising ValueError ends as a bad flag does: the message, exit 2."""
  from absl import flags

  monkeypatch.setattr(flags, "FLAGS", flags.FlagValues())  # no flag of the test process's own

  def refuse(argv, flag_values=None):
    raise ValueError("--config.x.y=1: set --config.x.z instead")

  monkeypatch.setattr(cli, "finish_config", refuse)
  with pytest.raises(SystemExit) as e:
    cli.parse_flags(["prog"])
  assert e.value.code == 2 and "error: --config.x.y=1: set --config.x.z instead" in capsys.readouterr().err


@pytest.mark.slow  # two programs started; the default suite checks the messages in process (tests/bench/studies)
def test_benchmark_flags_it_would_overwrite_or_not_read_exit_2_before_anything_trains(tmp_path):
  """`python -m experiments.benchmark` refuses a field it sets per run, another study's field, and a
  method named in `hybrid.method`: each the message naming the field and the fix, exit 2, nothing written."""
  cases = [
    (("--config.seed=7",), "--config.seed=7 is set but unused: the benchmark sets each run's seed"),
    (("--config.benchmark.ladder.rungs=R3,R4",), "add --config.benchmark.study=ladder"),
    (("--config.mode=hybrid", "--config.hybrid.method=jump"), "name the method in --config.benchmark.methods"),
  ]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for i, (args, message) in enumerate(cases):
    r = subprocess.run(
      [sys.executable, "-m", "experiments.benchmark", "--quick", *args, f"--workdir={tmp_path}/{i}"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
      env=env,
    )
    assert r.returncode == 2, (args, r.returncode, r.stderr[-2000:])
    assert message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
    assert not os.path.exists(tmp_path / str(i))


def test_a_config_files_own_error_prints_its_message_not_the_traceback_ml_collections_quotes(capsys):
  # ml_collections wraps an error raised in `get_config` in "Error whilst parsing config file" and the
  # whole traceback: the user reads the file's message, as for any bad flag.
  quoted = (
    "flag --config=experiments/configs/gpt2_small.py:tiny,Micro: Error whilst parsing config file:\n\n"
    'Traceback (most recent call last):\n  File "x.py", line 1, in get_config\n    raise ValueError(\n'
    "ValueError: unknown preset variant 'Micro' in 'tiny,Micro': use one of ['micro', 'speedrun']\n"
  )
  with pytest.raises(SystemExit) as e:
    cli._flag_error(ValueError(quoted))  # noqa: SLF001
  err = capsys.readouterr().err
  assert e.value.code == 2 and "Traceback" not in err and "File " not in err
  assert err.startswith(
    "error: flag --config=experiments/configs/gpt2_small.py:tiny,Micro: unknown preset variant 'Micro' in "
    "'tiny,Micro': use one of ['micro', 'speedrun']\n"
  )


def test_an_arm_takes_its_methods_settings_on_the_command_line(monkeypatch):
  """`--config.benchmark.arms.<name>.overrides.<field>=VALUE`, as docs/benchmark.md prints it: the arm's
  run config gets the value, parsed as the field's type; a field its run config lacks is refused."""
  from hybridjax.bench import arms as arms_lib
  from hybridjax.bench import specs

  path = os.path.join(ROOT, "experiments", "configs", "benchmark.py")
  flags_as_printed = [
    "--config.benchmark.arms.jump50.method=jump",
    "--config.benchmark.arms.jump50.overrides.hybrid.jump.every=50",
    "--config.benchmark.methods=jump50",
  ]
  with open(os.path.join(ROOT, "docs", "benchmark.md")) as f:
    assert "python -m experiments.benchmark --quick " + " ".join(flags_as_printed) + "\n" in f.read()
  c = _parsed(monkeypatch, f"{path}:quick", *flags_as_printed)
  arm = arms_lib.arms(c)["jump50"]
  assert arm.overrides == {"hybrid.jump.every": 50} and isinstance(arm.overrides["hybrid.jump.every"], int)
  # Its control arm, from the jump's CONTROL, as a method named in benchmark.methods gets one: with its
  # arm's overrides, and run with it.
  control = arms_lib.arms(c)["jump50_control"]
  assert (control.method, control.control, control.control_of) == ("jump", True, "jump50")
  assert control.overrides == {"hybrid.jump.every": 50}
  assert arms_lib.selected(c) == ["jump50", "jump50_control"]
  from hybridjax.bench import study

  study.validate(c)
  spec = specs.run_spec(c, kind="method", seed=1, lr=0.01, steps=40, beta=0.9, method="jump50")
  assert spec["config"]["hybrid"]["method"] == "jump" and spec["config"]["hybrid"]["jump"]["every"] == 50
  # An existing arm's setting too; and a field the arm's run config does not hold is named.
  c = _parsed(monkeypatch, f"{path}:quick", "--config.benchmark.arms.jump.overrides.hybrid.jump.every=7")
  assert arms_lib.arms(c)["jump"].overrides["hybrid.jump.every"] == 7
  from experiments.configs import benchmark as benchmark_cfg

  # The "did you mean" searches the arm's own fields (its run config's), not another arm's.
  misspelt = (
    r"--config\.benchmark\.arms\.jump50\.overrides\.hybrid\.jump\.everyy is not a field of arm 'jump50': "
    r"did you mean --config\.benchmark\.arms\.jump50\.overrides\.hybrid\.jump\.every\? "
  )
  with pytest.raises(ValueError, match=misspelt):
    cli.prepare_for_overrides(
      benchmark_cfg.get_config("quick"),
      [
        "prog",
        "--config.benchmark.arms.jump50.method=jump",
        "--config.benchmark.arms.jump50.overrides.hybrid.jump.everyy=5",
      ],
      benchmark_cfg.prepare_overrides,
    )


def test_the_mlp_tasks_fields_are_set_on_the_benchmarks_command_line(monkeypatch):
  """With `--config.benchmark.task=mlp` the task's block exists at its defaults (the config file's
  `before_command_line`), so `--config.mlp.*` sets its fields, parsed as their types; a misspelt one names
  the nearest or the block's fields; an mlp field for another task names the task that reads it; a bad value
  is refused by the benchmark's check of the block, naming the field."""
  from hybridjax.bench import study

  path = os.path.join(ROOT, "experiments", "configs", "benchmark.py") + ":quick"
  c = _parsed(monkeypatch, path, "--config.benchmark.task=mlp", "--config.mlp.features=(64, 64)")
  assert tuple(c.mlp.features) == (64, 64) and c.mlp.n_in == 8
  study.validate(c, ["benchmark.task", "mlp.features"])
  for flag, message in (
    ("--config.mlp.widht=64", r"--config\.mlp\.widht is not a field of the config: the mlp block holds \['eval_"),
    (
      "--config.mlp.featurs=(8,)",
      r"--config\.mlp\.featurs is not a field of the config: did you mean --config\.mlp\.features\?",
    ),
  ):
    with pytest.raises(Exception, match=message):
      _parsed(monkeypatch, path, "--config.benchmark.task=mlp", flag)
  with pytest.raises(Exception, match=r"--config\.mlp\.n_in is a field of the mlp task's block, and the benchmark's "
                     r"task is 'gpt2': add --config\.benchmark\.task=mlp"):  # fmt: skip
    _parsed(monkeypatch, path, "--config.mlp.n_in=4")
  # The held-out examples the evals need, checked before anything is written (the task refuses them in the runs).
  c = _parsed(monkeypatch, path, "--config.benchmark.task=mlp", "--config.trainer.eval_batches=100")
  need = c.trainer.eval_batches * c.trainer.batch_size
  with pytest.raises(
    ValueError,
    match=rf"need {need} held-out examples, but --config\.mlp\.eval_examples=.*raise --config\.mlp\.eval_examples",
  ):
    study.validate(c, ["benchmark.task", "trainer.eval_batches"])
  c = _parsed(
    monkeypatch,
    path,
    "--config.benchmark.task=mlp",
    "--config.trainer.eval_batches=100",
    f"--config.mlp.eval_examples={need}",
  )
  study.validate(c, ["benchmark.task", "trainer.eval_batches", "mlp.eval_examples"])
  c = _parsed(monkeypatch, path, "--config.benchmark.task=mlp", "--config.mlp.n_in=0")
  with pytest.raises(ValueError, match=r"--config\.mlp\.n_in must be >= 1, got 0"):
    study.validate(c, ["benchmark.task", "mlp.n_in"])


def test_an_arm_the_run_would_not_train_is_refused_and_the_start_up_line_lists_the_arms(monkeypatch, tmp_path):
  """An arm the command line defines but `benchmark.methods` does not name is refused before anything is
  written, naming --config.benchmark.methods; named there, it runs with its control arm, and the family's
  first line lists the arms."""
  from hybridjax.bench import study
  from hybridjax.bench.studies.family import run as family_run

  path = os.path.join(ROOT, "experiments", "configs", "benchmark.py")
  argv = ["--config.benchmark.arms.j3.method=jump", "--config.benchmark.arms.j3.overrides.hybrid.jump.every=3"]
  c = _parsed(monkeypatch, f"{path}:quick", *argv)
  workdir = tmp_path / "w"
  with pytest.raises(ValueError) as e:
    study.run(c, str(workdir), "", cli.command_line_fields(argv))
  assert str(e.value).startswith(
    "--config.benchmark.arms.j3 is defined but not trained: --config.benchmark.methods does not name it, so the "
    "run would train and report other arms only. Name it there (e.g. "
    "--config.benchmark.methods=jump,skip_control,j3), or leave out the --config.benchmark.arms.j3.* flags"
  ), e.value
  assert not workdir.exists()
  c = _parsed(monkeypatch, f"{path}:quick", *argv, "--config.benchmark.methods=jump,j3")
  study.validate(c, cli.command_line_fields([*argv, "--config.benchmark.methods=jump,j3"]))
  assert "; arms jump,j3,j3_control; workdir w" in family_run.header(c, "w")[0]
  c.benchmark.study = "recipe"
  assert study.unrun_arm_errors(c, cli.command_line_fields(argv)) == [
    "--config.benchmark.arms.j3 is defined but not trained: the recipe study trains no method arm, so the run "
    "would train and report other arms only. Run it with --config.benchmark.study=family (or ladder), or leave "
    "out the --config.benchmark.arms.j3.* flags"
  ]
