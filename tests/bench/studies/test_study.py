"""The skeleton (`hybridjax.bench.study`): which study a config names, the old flags, the checks it
runs before anything is written, and a new study as one folder plus one line of `STUDIES`."""

from __future__ import annotations

import ast
import contextlib
import json
import pathlib
import sys
import textwrap

import pytest

from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import study

PACKAGE = pathlib.Path(study.__file__).resolve().parents[1]


def test_the_study_field_picks_the_study_and_names_itself_when_wrong():
  c = benchmark_cfg.get_config("quick")
  assert study.study_name(c) == "family"
  c.benchmark.study = "ladder"
  assert study.study_name(c) == "ladder"
  c.benchmark.study = "ladders"
  with pytest.raises(ValueError, match=r"--config\.benchmark\.study='ladders': give one of family, ladder, recipe"):
    study.study_name(c)


def test_the_old_flags_warn_naming_the_new_field_and_both_together_are_refused():
  c = benchmark_cfg.get_config("quick")
  c.benchmark.recipe = True
  with pytest.warns(FutureWarning, match=r"use --config\.benchmark\.study=recipe"):
    assert study.study_name(c) == "recipe"
  c.benchmark.ladder = True  # once the ladder silently won
  with pytest.raises(ValueError, match="both set"):
    study.study_name(c)
  c.benchmark.update(recipe=False, study="recipe")
  with pytest.raises(ValueError, match="name different studies"):
    study.study_name(c)


def test_only_the_skeleton_makes_a_runner_or_checks_the_benchmark_block():
  for path in sorted(PACKAGE.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("make_runner", "validate_benchmark"):
          assert path == PACKAGE / "bench" / "study.py", f"{path} calls {name}: only hybridjax/bench/study.py may"


TOY_CONFIG = """
def add_defaults(b, preset):
  b.toy_size = 1


def validate(config):
  if config.benchmark.toy_size < 1:
    raise ValueError("--config.benchmark.toy_size must be >= 1")
  return {}
"""
TOY_RUN = """
RECORD = "toy-{preset}.json"


def header(config, workdir):
  return [f"toy {config.benchmark.preset}"]


def train(config, runner):
  return {"runs": [runner.run(config.benchmark.toy_size)]}


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
  assert c.benchmark.toy_size == 1  # its field, declared in its folder
  c.benchmark.toy_size = 0
  with pytest.raises(ValueError, match="toy_size"):  # its own check, before anything is written
    study.run(c, str(tmp_path / "work"))
  assert not (tmp_path / "work").exists()
  c.benchmark.toy_size = 3
  for _ in range(2):  # a second invocation extends the first's
    result = study.run(c, str(tmp_path / "work"), command="toy command")
  written = json.loads((tmp_path / "work" / "toy-quick.json").read_text())
  assert written["toy"] == [6] and written["command"] == "toy command" and written["steps"] == c.trainer.steps
  assert written["config"]["benchmark"]["study"] == "toy" and "machine" in written
  assert len(result["invocations"]) == 2 and result["runs_trained"] == 1
  out = capsys.readouterr().out
  assert "toy quick" in out and "toy trained [6]" in out and "toy wall time" in out
  monkeypatch.setitem(study.STUDIES, "ladder", "toy_study")  # an old flag, for a study that trains nothing
  c.benchmark.update(study="family", ladder=True)
  with pytest.warns(FutureWarning) as warned:
    study.run(c, str(tmp_path / "old"))
  assert len([w for w in warned if issubclass(w.category, FutureWarning)]) == 1  # once, not per check
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
