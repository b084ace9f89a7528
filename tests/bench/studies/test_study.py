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
from hybridjax.bench.studies import Study

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
    assert specs.current_names(argv) == [
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
    assert specs.current_names(["prog", "--config.benchmark.recipe=False"]) == ["prog"]
  for both in (["--config.benchmark.ladder=True", "--config.benchmark.recipe=True"], ["--config.benchmark.ladder"]):
    with pytest.warns(FutureWarning), pytest.raises(SystemExit, match="name different studies"):
      specs.current_names(["prog", *both, "--config.benchmark.study=recipe"])
  with pytest.warns(FutureWarning):  # the same study twice is no conflict
    assert specs.current_names(["p", "--config.benchmark.recipe", "--config.benchmark.study=recipe"])[1:] == [
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
from hybridjax.bench.studies import Study

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


STUDY = Study(header, train, record, markdown, RECORD, time_steps=time_steps, write=write)
"""


class _StubRunner:
  """Trains nothing: a run is its size doubled."""

  ran, reused = 1, 0

  def run(self, size: int) -> int:
    return 2 * size


def test_a_misspelt_config_hook_is_refused_naming_the_hook(tmp_path, monkeypatch):
  """A config.py hook the skeleton would never call (`trained_arm` for `trained_arms`) fails when the
  study's config is first read, before anything trains."""
  folder = tmp_path / "typo_study"
  folder.mkdir()
  (folder / "__init__.py").write_text("")
  (folder / "config.py").write_text(textwrap.dedent(TOY_CONFIG) + "\n\ndef trained_arm(config):\n  return [], ''\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setitem(study.STUDIES, "typo", "typo_study")
  with pytest.raises(ValueError, match=r"typo_study\.config defines 'trained_arm'.* name it 'trained_arms'"):
    benchmark_cfg.get_config("quick")


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
  # A second benchmark of another config in the same workdir keeps the first's report beside its own.
  (tmp_path / "work" / "cache").mkdir(exist_ok=True)
  c.benchmark.toy.size = 4
  again = study.run(c, str(tmp_path / "work"), command="toy command")
  (kept,) = [p for p in (tmp_path / "work").iterdir() if p.name.startswith("earlier-")]
  assert json.loads((kept / "toy-quick.json").read_text())["toy"] == [6]
  assert json.loads((tmp_path / "work" / "toy-quick.json").read_text())["toy"] == [8]
  assert len(again["invocations"]) == 1  # its own, not the other config's
  assert (tmp_path / "work" / "cache").is_dir()  # the run cache stays, shared
  out = capsys.readouterr().out
  assert f"held the report of another benchmark (benchmark.toy.size: 3 there, 4 here); it is kept in {kept}" in out
  for name in ("toy_study.run", "toy_study.config", "toy_study"):  # another test may make another toy_study
    sys.modules.pop(name, None)


@pytest.mark.parametrize("name", list(study.STUDIES))
def test_every_study_has_the_skeletons_hooks(name):
  import importlib

  run = importlib.import_module(study.STUDIES[name] + ".run")
  assert isinstance(run.STUDY, Study)  # each hook a required field of it: one missing fails at import
  for hook in ("header", "train", "record", "markdown", "time_steps", "write"):
    assert getattr(run.STUDY, hook) is None or callable(getattr(run.STUDY, hook)), f"{name}'s STUDY.{hook}"
  config = importlib.import_module(study.STUDIES[name] + ".config")
  assert callable(config.validate)
  assert callable(getattr(config, "add_defaults", None)) or hasattr(config, "FIELDS") or name == "family"


def test_a_study_missing_a_hook_fails_at_import():
  with pytest.raises(TypeError, match="record_name"):
    Study(*[lambda *a: None] * 4)


def test_the_speedrun_family_applies_its_tricks_after_the_command_line():
  """`long,speedrun` with the command line's recipe fields trains those tricks at that LR (as R6 would),
  a derived value follows an override (the warm-up, `trainer.steps`), a field the command line set wins
  (the LR, the iterate); with no override the family is the preset as `get_config` builds it."""
  from hybridjax import config as config_lib
  from hybridjax.bench import speedrun

  def parsed(overrides):  # as the program parses it: the overrides, then the file's after_command_line
    c = benchmark_cfg.get_config("long,speedrun")
    c.update_from_flattened_dict(overrides)
    return benchmark_cfg.after_command_line(c, "long,speedrun", list(overrides))

  c = parsed({"benchmark.recipe.tricks": "schedule,muon", "benchmark.recipe.muon_lr": 0.05})
  base = benchmark_cfg.get_config("long")
  base.benchmark.recipe.update(tricks="schedule,muon", muon_lr=0.05)
  assert config_lib.flatten(c) == config_lib.flatten(speedrun.speedrun_config(base))
  assert c.optim.learning_rate == 0.05 and c.optim.name == "muon_groups" and not c.model.rotary
  study.validate(c)
  c = parsed({"trainer.steps": 1000})
  assert c.optim.muon_momentum_warmup_steps == round(speedrun.MOMENTUM_WARMUP_FRACTION * 1000) == 156
  assert c.benchmark.recipe.keep == "trainer.steps"
  study.validate(c)
  c = parsed({"optim.learning_rate": 0.03, "benchmark.iterate": "averaged"})
  assert (c.optim.learning_rate, c.benchmark.iterate) == (0.03, "averaged")
  study.validate(c)
  assert config_lib.flatten(parsed({})) == config_lib.flatten(benchmark_cfg.get_config("long,speedrun"))


@pytest.mark.parametrize("arg", ["long", "long,speedrun"])
def test_the_jump_schedule_follows_the_command_lines_steps(arg):
  """`--config.trainer.steps` scales the jump schedule as the preset scaled it to its own N
  (`scale_jump_schedule`): at 300 steps long's horizons (50, 100, 200) would never fit the jump window
  (now refused), and at 1000 a run would jump on the 3000-step schedule. A jump field the command
  line set itself is kept."""

  def parsed(overrides):
    c = benchmark_cfg.get_config(arg)
    c.update_from_flattened_dict(overrides)
    return benchmark_cfg.after_command_line(c, arg, list(overrides))

  for steps in (300, 1000):
    c = parsed({"trainer.steps": steps})
    assert c.hybrid.jump.horizons == tuple(benchmark_cfg.scaled_steps(k, steps) for k in (50, 100, 200))
    assert c.hybrid.jump.every == benchmark_cfg.scaled_steps(100, steps)
    assert c.hybrid.jump.forecaster.every == benchmark_cfg.scaled_steps(50, steps)
    study.validate(c)
  c = parsed({"trainer.steps": 300, "hybrid.jump.every": 7})
  assert c.hybrid.jump.every == 7 and c.hybrid.jump.horizons == (5, 10, 20)
  assert parsed({}).hybrid.jump.horizons == (50, 100, 200)
  unscaled = benchmark_cfg.get_config(arg)
  unscaled.trainer.steps = 300  # from Python, without after_command_line: refused, not a run that never jumps
  with pytest.raises(ValueError, match="never fits this run's jump window|not its recipe's"):
    study.validate(unscaled)


@pytest.mark.parametrize(
  "change,match",
  [
    (lambda c: setattr(c.trainer, "steps", 1000), r"muon_momentum_warmup_steps=469 where benchmark\.recipe gives 156"),
    (
      lambda c: setattr(c.benchmark.recipe, "muon_lr", 0.05),
      r"learning_rate=0\.02 where benchmark\.recipe gives 0\.05",
    ),
  ],
)
def test_the_speedrun_family_changed_from_python_after_its_tricks_is_refused(change, match):
  c = benchmark_cfg.get_config("long,speedrun")
  study.validate(c)
  change(c)
  with pytest.raises(ValueError, match=rf"the speedrun family's config is not its recipe's \(.*{match}.*get_config"):
    study.validate(c)


@pytest.mark.parametrize(
  "field,value,nearest",
  [
    ("method", "mypkg.x", "methods"),
    ("seed", (4, 5, 6), "seeds"),
    ("recipe.trick", "schedule", "recipe.tricks"),
    ("ladder.rung", "R3", "ladder.rungs"),
    ("ladder.muon.learnin_rate", 0.1, "ladder.muon.learning_rate"),
  ],
)
def test_a_misspelt_benchmark_key_set_from_python_is_refused_naming_the_nearest(field, value, nearest):
  """The preset is locked: the misspelling fails at the assignment, with ml_collections' "did you
  mean"; an unlocked copy is refused by the study's check, naming the nearest field."""
  block, *path = ["benchmark", *field.split(".")]

  def misspell(c):
    node = c[block]
    for part in path[:-1]:
      node = node[part]
    setattr(node, path[-1], value)

  with pytest.raises((AttributeError, KeyError), match=rf'Did you mean "{nearest.split(".")[-1]}"'):
    misspell(benchmark_cfg.get_config("quick"))
  c = ml_collections.ConfigDict(benchmark_cfg.get_config("quick").to_dict())
  c.benchmark = specs.BenchmarkBlock(c.benchmark)
  misspell(c)  # ml_collections adds a key to an unlocked config
  message = rf"--config\.benchmark\.{field} is not a field of the benchmark block: did you mean "
  message += rf"--config\.benchmark\.{nearest}\?"
  with pytest.raises(ValueError, match=message):
    study.validate(c)


@pytest.mark.parametrize("arg", ["quick", "long,speedrun"])
def test_a_benchmark_value_set_from_python_is_checked_at_the_assignment(arg):
  """The benchmark block's and each study block's declared fields are checked as they are set, as the command
  line's are, naming the field (a preset's copy included: the speedrun family's); a valid value is taken."""
  c = benchmark_cfg.get_config(arg)
  with pytest.raises(ValueError, match=r"^--config\.benchmark\.tuner must be 'lr' .*, got 'Joint'$"):
    c.benchmark.tuner = "Joint"
  with pytest.raises(ValueError, match=r"^--config\.benchmark\.optimizers\.cell must be one of \[.*\], got 'corpos'$"):
    c.benchmark.optimizers.cell = "corpos"
  with pytest.raises(ValueError, match=r"--config\.benchmark\.ladder\.constant_eval_points must be >= 4, got 2"):
    c.benchmark.ladder.update(constant_eval_points=2)
  c.benchmark.update(tuner="joint", study="optimizers")
  c.benchmark.optimizers.cell = "corpus"
  assert (c.benchmark.tuner, c.benchmark.optimizers.cell) == ("joint", "corpus")


def test_the_benchmark_blocks_fields_are_the_presets_and_the_iterate_is_checked():
  """`specs.FIELDS` and the study blocks are every field a preset writes (else the check refuses one
  of them, or takes a typo); `benchmark.iterate` is 'averaged' or 'best'."""
  from hybridjax import config as config_lib

  for arg in ("quick", "long", "124m", "long,speedrun"):
    c = benchmark_cfg.get_config(arg)
    written = {k for k in config_lib.flatten(c.benchmark) if not k.startswith(("arms.", "ladder.muon."))} | {"arms"}
    assert written == {k for k in study.known_fields(c.benchmark.preset) if not k.startswith("ladder.muon.")}
  c = benchmark_cfg.get_config("quick")
  with pytest.raises(ValueError, match=r"--config\.benchmark\.iterate must be 'averaged' .* or 'best' .*, got 'bset'"):
    c.benchmark.iterate = "bset"  # at the assignment, as on the command line
  c = ml_collections.ConfigDict(c.to_dict())  # a plain copy (a stored record's): refused where it is read
  c.benchmark.iterate = "bset"
  with pytest.raises(ValueError, match=r"--config\.benchmark\.iterate must be 'averaged' .* or 'best' .*, got 'bset'"):
    study.validate(c)


_UNUSED = "is set but unused"
_ADD = r"add --config\.benchmark\.study="


@pytest.mark.parametrize(
  "fields,study_name,match",
  [
    ({"seed": 7}, "family", rf"--config\.seed=7 {_UNUSED}: .*benchmark\.seeds .*: leave out --config\.seed"),
    ({"mode": "hybrid"}, "family", rf"--config\.mode='hybrid' {_UNUSED}: .*--config\.benchmark\.methods"),
    ({"trainer.eval_every": 5}, "family", r"leave out --config\.trainer\.eval_every and set .*eval_points"),
    ({"trainer.log_every": 5}, "recipe", rf"--config\.trainer\.log_every=5 {_UNUSED}"),
    ({"trainer.averaging_beta": 0.9}, "family", r"leave out --config\.trainer\.averaging_beta and set .*betas"),
    (
      {"benchmark.ladder.rungs": "R3,R4"},
      "family",
      rf"ladder\.rungs='R3,R4' {_UNUSED}: it is read by the ladder study, and --config\.benchmark\.study='family' "
      rf"runs the family protocol: {_ADD}ladder",
    ),
    ({"benchmark.variants.set": "fixes"}, "ladder", rf"{_ADD}variants"),
    ({"benchmark.knobs.lr_points": 4}, "recipe", rf"{_ADD}knobs"),
    ({"benchmark.recipe.tricks": "schedule"}, "family", r"read by the recipe study, the ladder's R6 and the speedrun"),
    ({"benchmark.recipe.budgets": (5.0,)}, "ladder", rf"recipe\.budgets=\(5\.0,\) {_UNUSED}: it is read by the recipe"),
    ({"benchmark.methods": "jump"}, "recipe", r"the recipe study trains anchors only, no method arm"),
    ({"benchmark.methods": "jump"}, "knobs", r"the knobs study trains anchors only"),
    ({"benchmark.methods": "jump"}, "anchor", r"the anchor study trains anchors only"),  # it declares no trained arms
    (
      {"benchmark.recipe.keep": "model.relu2"},
      "anchor",
      r"it is read by the recipe, variants, knobs and optimizers studies, the ladder's R6 and the speedrun family, "
      r"and --config\.benchmark\.study='anchor' runs the anchor study",
    ),
    (
      {"benchmark.methods": "jump", "benchmark.ladder.rungs": "R0,R1"},
      "ladder",
      r"only at its tuned rungs R3,R4,R5,R6, and --config\.benchmark\.ladder\.rungs='R0,R1' has none",
    ),
  ],
)
def test_a_field_the_study_would_overwrite_or_not_read_is_refused_naming_the_fix(fields, study_name, match):
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = study_name
  c.update_from_flattened_dict(fields)
  with pytest.raises(ValueError, match=match):
    study.validate(c, list(fields))


@pytest.mark.parametrize(
  "fields,study_name",
  [
    ({"trainer.averaging_beta": 0.9}, "ladder"),  # R0-R2 train at it
    ({"benchmark.recipe.tricks": "schedule,muon"}, "ladder"),  # R6 reads it
    ({"benchmark.recipe.keep": "model.relu2"}, "recipe"),
    ({"benchmark.recipe.keep": "model.relu2"}, "variants"),  # the recipe's declaration names it a reader
    ({"benchmark.methods": "jump", "benchmark.ladder.rungs": "R1,R3"}, "ladder"),
    ({"benchmark.methods": "jump"}, "family"),
    ({"trainer.steps": 80, "optim.learning_rate": 0.01}, "family"),
  ],
)
def test_a_field_the_study_reads_is_taken(fields, study_name):
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = study_name
  c.update_from_flattened_dict(fields)
  assert study.unused_field_errors(c, list(fields)) == []


def test_a_method_named_in_hybrid_method_points_to_the_benchmarks_methods_and_arms():
  """`--config.mode=hybrid --config.hybrid.method=...` is not what the benchmark reads: the message
  names `benchmark.methods` and `benchmark.arms`, not `mode=hybrid` (the runs' experiment config is in
  baseline mode until an arm sets its own)."""
  c = benchmark_cfg.get_config("quick")
  c.hybrid.method = "jump"
  message = r"--config\.hybrid\.method='jump': the benchmark runs a method as an arm.*"
  message += r"--config\.benchmark\.methods=jump.*--config\.benchmark\.arms\.<name>\.method=jump"
  with pytest.raises(ValueError, match=message):
    specs.validate_benchmark(c)
  c.mode = "hybrid"
  with pytest.raises(ValueError, match=r"--config\.mode='hybrid' is set but unused.*; " + message):
    study.validate(c, ["mode", "hybrid.method"])


def test_a_fixed_decay_length_is_refused_in_the_benchmark():
  """Each budget's schedule decays over its own steps (`run_spec` sets `trainer.steps`); an
  `optim.decay_steps` would give every budget one schedule and bend the anchors' budget curve."""
  c = benchmark_cfg.get_config("quick")
  specs.validate_benchmark(c)
  c.optim.decay_steps = 40
  with pytest.raises(ValueError, match=r"--config\.optim\.decay_steps=40: the benchmark gives each budget its own"):
    specs.validate_benchmark(c)


def test_the_mlp_tasks_block_and_unread_fields_are_refused():
  """With `benchmark.task='mlp'` the gpt2 model and data fields are read by nothing, and the task's own
  block must hold exactly its fields: a misspelt one would train the default, a missing one fail
  after the workdir is made."""
  from hybridjax.tasks import mlp

  c = benchmark_cfg.get_config("quick")
  c.benchmark.task = "mlp"
  study.validate(c)
  with pytest.raises(
    ValueError, match=r"--config\.model\.n_layer=1 is set but unused: --config\.benchmark\.task='mlp'"
  ):
    study.validate(c, ["model.n_layer"])
  with c.unlocked():  # the task's block, added by its owner
    c.mlp = mlp.default_task_config()
  c.mlp.features = (8,)
  study.validate(c)
  with c.unlocked():
    c.mlp = {"features": (8,), "hiden": 3}
  with pytest.raises(ValueError, match=r"--config\.mlp\.hiden is not a field.*the mlp block lacks \['eval_examples'"):
    study.validate(c)


def test_a_users_task_refuses_the_gpt2_tasks_fields_it_does_not_read(tmp_path, monkeypatch):
  """A user's task reads no model or data block unless its `READS` says so: `--config.data.path` or
  `--config.model.n_layer=4` would be recorded in every run's config and key and never read."""
  pkg = tmp_path / "my_tasks"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "regression.py").write_text("from hybridjax.tasks.mlp import build_task  # noqa: F401\n")
  (pkg / "text.py").write_text("from hybridjax.tasks.mlp import build_task  # noqa: F401\n\nREADS = ('data',)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  c = benchmark_cfg.get_config("quick")
  c.benchmark.task = "my_tasks.regression"
  study.validate(c)
  with pytest.raises(ValueError, match=r"--config\.model\.n_layer=4 is set but unused: --config\.benchmark\.task="):
    c.model.n_layer = 4
    study.validate(c, ["model.n_layer"])
  c.model.n_layer = 1
  c.data.path = str(tmp_path / "corpus.txt")  # from Python: no preset gives a corpus
  with pytest.raises(ValueError, match=r"--config\.data\.path=.* reads no block of a task's \(its READS\)"):
    study.validate(c)
  c.benchmark.task = "my_tasks.text"  # declares that it reads the data block
  assert not [e for e in study.unused_field_errors(c) if "data.path" in e]


def test_each_budget_gets_its_own_muon_momentum_warmup():
  """Each budget its own schedule, its momentum warm-up too: the recipe's share of its run (as the
  `shortcuts` trick gives a run of that length), a warm-up of the config's own in proportion; N keeps
  its warm-up (its runs keep their keys) and a family without one has none."""
  from hybridjax.bench import speedrun

  def warmup(c, steps):
    spec = specs.run_spec(c, kind="anchor", seed=1, lr=0.02, steps=steps, beta=0.99)
    return spec["config"]["optim"]["muon_momentum_warmup_steps"]

  c = benchmark_cfg.get_config("long,speedrun")
  n = int(c.trainer.steps)
  assert warmup(c, n) == c.optim.muon_momentum_warmup_steps == round(speedrun.MOMENTUM_WARMUP_FRACTION * n)
  for f in c.benchmark.budgets:
    steps = round(f * n)
    assert warmup(c, steps) == max(1, round(speedrun.MOMENTUM_WARMUP_FRACTION * steps)), f
  assert warmup(c, n // 2) == 234 and warmup(c, 2 * n) == 938
  c.optim.muon_momentum_warmup_steps = 300  # not the recipe's share: the same share of each budget
  assert (warmup(c, n), warmup(c, n // 2), warmup(c, 2 * n)) == (300, 150, 600)
  assert warmup(benchmark_cfg.get_config("long,muon"), 2 * n) == 0


def test_the_plateau_rule_adds_only_the_plateau_seeds_that_are_not_headline_seeds():
  c = benchmark_cfg.get_config("quick")
  c.benchmark.seeds, c.benchmark.plateau_seeds = (1, 2, 3), (3, 4, 5)
  assert specs.plateau_extension(c) == ([1, 2, 3], [4, 5])
  c.benchmark.plateau_seeds = (2,)
  assert specs.plateau_extension(c) == ([1, 2, 3], [])
