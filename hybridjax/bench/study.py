"""The benchmark's skeleton, written once for every study (`benchmark.study`): check the config, make
the runner, train, time, build the record (its header here, its figures the study's), write its json,
markdown and plots (and the published copy), print it.

A study is a folder `studies/<name>/` and a line in `STUDIES`. Its `config.py` has `add_defaults(block,
preset)` (the fields of its block `benchmark.<name>`) and `validate(config)`, which checks them and
returns the other configs it trains (checked here like the config itself), and its fields' declarations
`FIELDS` (`schema.Field`, each checked here, and refused where set but unread: `Field.unread`); its
`run.py` declares its hooks as `STUDY` (`studies.Study`).
"""

from __future__ import annotations

import difflib
import importlib
import os
import time
from types import ModuleType

from hybridjax import config as config_lib
from hybridjax import schema
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import record, specs
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.runs.runner import make_runner
from hybridjax.bench.studies import STUDIES, Config, ReadBy, Record, Study

# The hooks a study's config.py may define (`validate` it must): read where it defines them.
CONFIG_HOOKS = ("FIELDS", "add_defaults", "validate", "reads", "unused_field_errors", "trained_arms")


def _part(name: str, part: str = "config") -> ModuleType:
  """Study `name`'s module `part` (its `config.py` or `run.py`; run.py's hooks are its `STUDY`'s fields).
  A public name of a config.py that is nearly a hook's, a hook misspelt that the skeleton would never
  call, is refused when the module is first read (a benchmark config builds every study's block)."""
  module = importlib.import_module(f"{STUDIES[name]}.{part}")
  for own in [n for n in vars(module) if part == "config" and not n.startswith("_") and n not in CONFIG_HOOKS]:
    if near := difflib.get_close_matches(own, CONFIG_HOOKS, 1, 0.8):
      raise ValueError(
        f"{module.__name__} defines {own!r}, no hook of a study's config.py ({', '.join(CONFIG_HOOKS)}): name "
        f"it {near[0]!r} if it is that hook, else start it with '_' (a helper)"
      )
  return module


def study_name(config: Config) -> str:
  """The study `config` runs: `benchmark.study`."""
  name = str(config.benchmark.get("study", "family"))
  if name not in STUDIES:
    raise ValueError(f"--config.benchmark.study={name!r}: give one of {', '.join(STUDIES)}")
  return name


def add_defaults(b: Config, preset: str) -> None:
  """Every study's block `benchmark.<name>` in the benchmark block `b`: its config.py's `FIELDS` at their
  defaults, checked as they are set (`specs.CheckedBlock`), then its `add_defaults(block, preset)` where it
  has one (a preset's own values, fields besides `FIELDS`); a study with neither (the family) has none."""
  for name in STUDIES:
    checks = _part(name)
    fields = getattr(checks, "FIELDS", ())
    block = specs.CheckedBlock(schema.block(fields)).declare(fields, f"benchmark.{name}")
    if hasattr(checks, "add_defaults"):
      checks.add_defaults(block, preset)
    if block:
      b[name] = block


def known_fields(preset: str) -> set[str]:
  """The dotted fields of a benchmark block: `specs.FIELDS` and every study's block at `preset`."""
  b = Config()
  add_defaults(b, preset)
  return set(specs.FIELDS) | set(config_lib.flatten(b))


def unused_field_errors(config: Config, fields: list[str] = ()) -> list[str]:
  """A line for each field that `fields` (dotted: those the command line set) or, from Python, a
  value away from every preset's (`Overwritten.preset_value`) gives, but that the study would overwrite or never
  read, naming it and the fix: a field the benchmark sets per run (`specs.OVERWRITTEN`), another study's block,
  `benchmark.methods` in a study that runs no method arm (or in a ladder without a tuned rung)."""
  name = study_name(config)
  flat = config_lib.flatten(config)
  given = set(fields) | {
    f
    for f, o in specs.OVERWRITTEN.items()
    if o.preset_value is not specs.PER_PRESET and f in flat and flat[f] != o.preset_value
  }
  checks = _part(name)  # a study's own checks, where it has them
  study_reads = checks.reads(config) if hasattr(checks, "reads") else set()
  errors = tasks_lib.unread_block_errors(specs.task_name(config), flat, given)
  for field in sorted(given):
    if field in specs.OVERWRITTEN:
      if field in study_reads:
        continue  # the study trains some runs at it (the ladder's constant rungs, untuned)
      errors.append(f"--config.{field}={flat.get(field)!r} is set but unused: {specs.OVERWRITTEN[field].why}")
    parts = field.split(".")
    if parts[0] == "benchmark" and len(parts) > 2 and parts[1] in STUDIES and parts[1] != name:
      declared = {f.name: f.unread for f in getattr(_part(parts[1]), "FIELDS", ())}.get(parts[2])
      # a field another study's owner declares read by others (`ReadBy`), else read by its own study alone
      why = declared(config) if isinstance(declared, ReadBy) else f"it is read by the {parts[1]} study"
      if why:
        runs = "the family protocol" if name == "family" else f"the {name} study"
        errors.append(
          f"--config.{field}={flat.get(field)!r} is set but unused: {why}, and "
          f"--config.benchmark.study={name!r} runs {runs}: add "
          f"--config.benchmark.study={parts[1]} (its study), or leave out --config.{field}"
        )
  if "benchmark.methods" in fields and not hasattr(checks, "trained_arms"):
    errors.append(
      f"--config.benchmark.methods={config.benchmark.methods!r} is set but unused: the {name} study trains anchors "
      "only, no method arm: run the methods with --config.benchmark.study=family (the protocol) or ladder, or leave "
      "out --config.benchmark.methods"
    )
  if hasattr(checks, "unused_field_errors"):
    errors += checks.unused_field_errors(config, fields)
  return errors + unrun_arm_errors(config, fields)


def unrun_arm_errors(config: Config, fields: list[str]) -> list[str]:
  """A line for each arm of `benchmark.arms` that `fields` (those the command line set) define or set
  but the study would not train (its config.py's `trained_arms`: none where it runs no method arm):
  the run would train and report other arms, this one only echoed in its command line."""
  touched = sorted({f.split(".")[2] for f in fields if f.startswith("benchmark.arms.") and f.count(".") >= 3})
  checks = _part(study_name(config))
  try:
    trained, named_by = checks.trained_arms(config) if hasattr(checks, "trained_arms") else ([], "")
  except ValueError:
    return []  # a bad `benchmark.methods`: `arms.selected` names it when the study validates
  errors = []
  for arm in (a for a in touched if a not in trained):
    if named_by:
      why = f"{named_by} does not name it"
      fix = (
        f"Name it there (e.g. --config.benchmark.methods={','.join([*arms_lib.names(config.benchmark.methods), arm])})"
      )
    else:
      why = f"the {study_name(config)} study trains no method arm"
      fix = "Run it with --config.benchmark.study=family (or ladder)"
    errors.append(
      f"--config.benchmark.arms.{arm} is defined but not trained: {why}, so the run would train and report "
      f"other arms only. {fix}, or leave out the --config.benchmark.arms.{arm}.* flags"
    )
  return errors


def validate(config: Config, command_line: list[str] = ()) -> Study:
  """Checks `config` for its study (`study_name`'s): the benchmark block's keys, the fields it would
  overwrite or not read (`command_line`: the fields the command line set, dotted), the benchmark
  block, the study's block, every other config it trains, before anything is compiled or written;
  returns its hooks (`studies.Study`)."""
  name = study_name(config)
  errors = specs.unknown_benchmark_fields(
    config, known_fields(str(config.benchmark.get("preset", "long")))
  ) + unused_field_errors(config, list(command_line))
  if errors and config.get("hybrid", {}).get("method", ""):
    errors.append(specs.method_field_error(config.hybrid.method))  # else `validate_benchmark` says it
  specs.refuse(errors)
  specs.validate_benchmark(config)
  specs.check_user_task(config)  # the anchors train the task's tx without train()
  specs.check_task_seeds(config)
  checks = _part(name)
  study: Study = _part(name, "run").STUDY
  tuner = str(config.benchmark.get("tuner", "lr"))
  if tuner not in study.tuners:
    runs_it = [s for s in STUDIES if tuner in _part(s, "run").STUDY.tuners]
    raise ValueError(
      f"--config.benchmark.tuner={tuner!r}: the {name} study tunes with {' or '.join(study.tuners)}; leave "
      f"--config.benchmark.tuner at 'lr' (or pick a study that runs it: {', '.join(runs_it)})"
    )
  fields = getattr(checks, "FIELDS", ())
  if isinstance(config.benchmark.get(name), Config):  # the study's block, as declared
    block = config_lib.flatten(config.benchmark[name])
    specs.refuse(schema.errors(f"benchmark.{name}", [f for f in fields if f.name in block], block))
  unread = _unread_errors(name, fields, config) if name in config.benchmark else []
  try:
    others = checks.validate(config)
  except ValueError as e:
    raise ValueError("; ".join([*unread, str(e)])) from None
  specs.refuse(unread)
  for what, other in others.items():
    try:
      specs.validate_benchmark(other)
    except ValueError as e:
      raise ValueError(f"{what} is not a valid run: {e}") from None
  return study


def _unread_errors(name: str, fields: list[schema.Field], config: Config) -> list[str]:
  """A line for each field of `benchmark.<name>` away from its default that its declaration says this
  config does not read (`schema.Field.unread`): it would do nothing without a word."""
  values = config.benchmark[name]
  return [
    f"--config.benchmark.{name}.{f.name}={values[f.name]!r} has no effect: {why}, or leave it at {f.default!r}"
    for f in fields
    if f.unread and record.plain(values[f.name]) != record.plain(f.default) and (why := f.unread(config))
  ]


def run(config: Config, workdir: str, command: str = "", command_line: list[str] = ()) -> Record:
  """Runs `config`'s study into `workdir` (and `benchmark.publish`); returns its record.
  `command_line`: the fields the command line set (dotted), which `validate` checks."""
  name = study_name(config)
  study = validate(config, command_line)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  print("\n".join(study.header(config, workdir)), flush=True)
  with make_runner(config, workdir) as runner:
    trained = study.train(config, runner)
  timed = {}  # a study that times no step (its verdicts in loss or steps) has no `time_steps`
  if study.time_steps:
    print("--- timing (interleaved, this process)", flush=True)
    timed = study.time_steps(config, trained)
  result = record.header(config, command) | study.record(config, trained, timed, command, runner)
  result |= {"runs_trained": runner.ran, "runs_cached": runner.reused, "wall_s": time.perf_counter() - t_start}
  kept = study.record_name.format(**result) if study.record_name else "benchmark.json"
  record.keep_earlier_report(config, workdir, kept, name)
  if study.record_name:
    earlier = record.stored(os.path.join(workdir, kept)).get("invocations", [])
    result["invocations"] = earlier + [{k: result[k] for k in ("date", "wall_s", "runs_trained", "runs_cached")}]
  publish = str(config.benchmark.publish)
  if study.write:
    study.write(result, trained, workdir, publish)
  else:
    ignore = study.publish_ignores or record.other_studies(name)
    record.write_and_publish(result, workdir, publish, study.record_name, study.markdown, study.plot, ignore)
  print("\n" + study.markdown(result))
  done = f"{runner.ran} runs trained, {runner.reused} cached"
  print(f"{name} wall time {result['wall_s']:.0f} s ({done}); outputs in {workdir}", flush=True)
  return result
