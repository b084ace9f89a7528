"""The skeleton (`hybridjax.bench.study`): which study a config names, each study's block of the
benchmark config and the names before the blocks, the checks it runs before anything is written, and a
new study as one folder plus one line of `STUDIES`."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import ml_collections
import pytest
from conftest import ROOT

from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import record, specs, study

PACKAGE = pathlib.Path(study.__file__).resolve().parents[1]


def test_the_study_field_picks_the_study_and_names_itself_when_wrong():
  c = benchmark_cfg.get_config("quick")
  assert study.study_name(c) == "family"
  c.benchmark.study = "ladder"
  assert study.study_name(c) == "ladder"
  c.benchmark.study = "ladders"
  with pytest.raises(ValueError, match=r"--config\.benchmark\.study='ladders': give one of family, ladder, recipe"):
    study.study_name(c)


def test_each_study_has_its_block_and_no_run_holds_one():
  c = benchmark_cfg.get_config("long")
  assert c.benchmark.ladder.rungs == "R0,R1,R2,R3,R4,R5,R6" and c.benchmark.recipe.muon_lr == 0.02
  assert c.benchmark.family == "adamw-cosine"  # the family has no fields of its own, so no block
  assert {f.split(".")[0] for f in specs.MOVED.values()} == {"ladder", "recipe"}
  assert not set(specs.MOVED) & set(c.benchmark)
  spec = specs.run_spec(c, kind="anchor", seed=1, lr=1e-3, steps=10, beta=0.99)
  assert "benchmark" not in spec["config"]


def test_an_old_flag_or_field_set_from_python_fails_naming_the_field_now():
  c = benchmark_cfg.get_config("quick")
  with pytest.raises(ValueError, match=r"^--config\.benchmark\.recipe=True is gone \(benchmark\.recipe is the recipe"):
    c.benchmark.recipe = True
  with pytest.raises(ValueError, match=r"pick the study with --config\.benchmark\.study=ladder$"):
    c.benchmark.update(ladder=False)
  with pytest.raises(ValueError, match=r"^--config\.benchmark\.ladder_rungs is now --config\.benchmark\.ladder\.rungs"):
    c.benchmark.ladder_rungs = "R6"
  with pytest.raises(
    ValueError, match=r"--config\.benchmark\.recipe_tricks is now --config\.benchmark\.recipe\.tricks"
  ):
    c.benchmark.update(recipe_tricks="schedule")
  assert "recipe_tricks" not in c.benchmark and c.benchmark.recipe.tricks == "schedule,muon"  # nothing set
  family = benchmark_cfg.get_config("long,speedrun")  # the recipe's copy of the config keeps the guard
  with pytest.raises(ValueError, match=r"recipe_muon_lr is now --config\.benchmark\.recipe\.muon_lr"):
    family.benchmark.recipe_muon_lr = 0.01
  copied = ml_collections.ConfigDict(c.to_dict())  # a plain copy takes the old field, the check refuses it
  copied.benchmark.untuned_lr = 0.01
  with pytest.raises(
    ValueError, match=r"--config\.benchmark\.untuned_lr is now --config\.benchmark\.ladder\.untuned_lr"
  ):
    study.validate(copied)


def test_the_command_line_takes_the_old_names_for_one_release_with_a_warning_naming_the_new_ones():
  argv = ["prog", "--config.benchmark.ladder=True", "--config.benchmark.ladder_rungs=R6", "--workdir=w"]
  argv += ["--config.benchmark.recipe_budgets", "(3.0,)", "--config.benchmark.muon.learning_rate=0.01"]
  with pytest.warns(FutureWarning) as warned:
    assert study.current_names(argv) == [
      "prog",
      "--config.benchmark.study=ladder",
      "--config.benchmark.ladder.rungs=R6",
      "--workdir=w",
      "--config.benchmark.recipe.budgets",
      "(3.0,)",
      "--config.benchmark.ladder.muon.learning_rate=0.01",
    ]
  assert [str(w.message).split(": ", 1)[1] for w in warned] == [
    "use --config.benchmark.study=ladder",
    "use --config.benchmark.ladder.rungs",
    "use --config.benchmark.recipe.budgets",
    "use --config.benchmark.ladder.muon.learning_rate",
  ]
  assert str(warned[0].message) == (
    "--config.benchmark.ladder=True is deprecated and goes in the next release: use --config.benchmark.study=ladder"
  )
  with pytest.warns(FutureWarning, match=r"--config\.benchmark\.recipe=False is deprecated .*: leave it out"):
    assert study.current_names(["prog", "--config.benchmark.recipe=False"]) == ["prog"]
  for both in (["--config.benchmark.ladder=True", "--config.benchmark.recipe=True"], ["--config.benchmark.ladder"]):
    with pytest.warns(FutureWarning), pytest.raises(SystemExit, match="name different studies"):
      study.current_names(["prog", *both, "--config.benchmark.study=recipe"])
  with pytest.warns(FutureWarning):  # the same study twice is no conflict
    assert study.current_names(["p", "--config.benchmark.recipe", "--config.benchmark.study=recipe"])[1:] == [
      "--config.benchmark.study=recipe",
      "--config.benchmark.study=recipe",
    ]


@pytest.mark.slow  # a program started (no run trained)
def test_the_old_names_on_the_command_line_reach_the_blocks(tmp_path):
  """The old flag and field, rewritten before the flags parse: the ladder's check reads the rung given."""
  r = subprocess.run(
    [sys.executable, "-m", "experiments.benchmark", "--quick", "--config.benchmark.ladder=True"]
    + ["--config.benchmark.ladder_rungs=R9", f"--workdir={tmp_path}/w"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert r.returncode == 2 and "--config.benchmark.ladder.rungs='R9': give rungs from" in r.stderr, r.stderr[-2000:]
  assert "FutureWarning: --config.benchmark.ladder_rungs is deprecated" in r.stderr
  assert not (tmp_path / "w").exists()


def test_a_record_from_before_the_blocks_reads_in_todays_shape():
  flat = {"preset": "long", "ladder": True, "recipe": False, "ladder_rungs": "R6", "recipe_tricks": "schedule"}
  config = record.stored_config({"config": {"benchmark": flat | {"muon": {"name": "muon"}}}}).benchmark
  assert config.to_dict() == {
    "preset": "long",
    "ladder": {"rungs": "R6", "muon": {"name": "muon"}},
    "recipe": {"tricks": "schedule"},
  }
  today = json.loads(benchmark_cfg.get_config("quick").to_json())  # as a record holds it
  assert record.stored_config({"config": today}).to_dict() == today


def test_a_record_names_the_folders_inside_the_repository_relative_to_it(tmp_path):
  command = f"python -m experiments.benchmark --workdir={ROOT}/runs/x --config.benchmark.publish {ROOT}/docs/r"
  command += f" --config.benchmark.publish={tmp_path}/out --config.x=/abs"
  assert record.relative_folders(command) == (
    "python -m experiments.benchmark --workdir=runs/x --config.benchmark.publish docs/r "
    f"--config.benchmark.publish={tmp_path}/out --config.x=/abs"
  )


def test_only_the_skeleton_makes_a_runner_or_checks_the_benchmark_block():
  for path in sorted(PACKAGE.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("make_runner", "validate_benchmark"):
          assert path == PACKAGE / "bench" / "study.py", f"{path} calls {name}: only hybridjax/bench/study.py may"


TOY_CONFIG = """
def add_defaults(block, preset):
  block.size = 1


def validate(config):
  if config.benchmark.toy.size < 1:
    raise ValueError("--config.benchmark.toy.size must be >= 1")
  return {}
"""
TOY_RUN = """
RECORD = "toy-{preset}.json"


def header(config, workdir):
  return [f"toy {config.benchmark.preset}"]


def train(config, runner):
  return {"runs": [runner.run(config.benchmark.toy.size)]}


def time_steps(config, trained):
  return {"ms": 1.0}


def record(config, trained, timed, command, runner):
  return {"toy": trained["runs"], "timing": timed}


def write(result, trained, workdir, publish):
  import json, os
  with open(os.path.join(workdir, RECORD.format(preset=result["preset"])), "w") as f:
    json.dump(result, f)


def markdown(result):
  return f"toy trained {result['toy']}"
"""


class _StubRunner:
  """Trains nothing: a run is its size doubled."""

  ran, reused = 1, 0

  def run(self, size: int) -> int:
    return 2 * size


def test_a_new_study_is_one_folder_and_one_line(tmp_path, monkeypatch, capsys):
  folder = tmp_path / "toy_study"
  folder.mkdir()
  (folder / "__init__.py").write_text("")
  (folder / "config.py").write_text(textwrap.dedent(TOY_CONFIG))
  (folder / "run.py").write_text(textwrap.dedent(TOY_RUN))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setitem(study.STUDIES, "toy", "toy_study")  # the one line
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(_StubRunner()))
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = "toy"
  assert c.benchmark.toy.size == 1  # its block, declared in its folder
  c.benchmark.toy.size = 0
  with pytest.raises(ValueError, match=r"toy\.size"):  # its own check, before anything is written
    study.run(c, str(tmp_path / "work"))
  assert not (tmp_path / "work").exists()
  c.benchmark.toy.size = 3
  for _ in range(2):  # a second invocation extends the first's
    result = study.run(c, str(tmp_path / "work"), command="toy command")
  written = json.loads((tmp_path / "work" / "toy-quick.json").read_text())
  assert written["toy"] == [6] and written["command"] == "toy command" and written["steps"] == c.trainer.steps
  assert written["config"]["benchmark"]["study"] == "toy" and "machine" in written
  assert len(result["invocations"]) == 2 and result["runs_trained"] == 1
  out = capsys.readouterr().out
  assert "toy quick" in out and "toy trained [6]" in out and "toy wall time" in out
  for name in ("toy_study.run", "toy_study.config", "toy_study"):  # another test may make another toy_study
    sys.modules.pop(name, None)


@pytest.mark.parametrize("name", list(study.STUDIES))
def test_every_study_has_the_skeletons_hooks(name):
  import importlib

  run = importlib.import_module(study.STUDIES[name] + ".run")
  for hook in ("header", "train", "time_steps", "record", "write", "markdown"):
    assert callable(getattr(run, hook, None)), f"{name}'s run.py has no {hook}()"
  config = importlib.import_module(study.STUDIES[name] + ".config")
  assert hasattr(run, "RECORD") and callable(config.validate) and callable(config.add_defaults)
