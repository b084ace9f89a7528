"""The benchmark's skeleton, written once for every study (`benchmark.study`): check the config, make
the runner, train, time, build the record (its header here, its figures the study's), write its json,
markdown and plots (and the published copy), print it.

A study is a folder `studies/<name>/` and a line in `STUDIES`. Its `config.py` has `add_defaults(block,
preset)` (the fields of its block `benchmark.<name>`) and `validate(config)`, which checks them and
returns the other configs it trains (checked here like the config itself);
its `run.py` has `header(config, workdir)` (the lines printed first), `train(config, runner)`,
`time_steps(config, trained)`, `record(config, trained, timed, command, runner)`,
`write(result, trained, workdir, publish)`, `markdown(result)` and `RECORD` (its json, whose
invocations a resumed study extends; None: it keeps none).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import re
import sys
import time
import warnings
from types import ModuleType
from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax import preflight
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import record, specs, speedrun
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.runs.runner import make_runner
from hybridjax.bench.studies import STUDIES


def study_name(config: ml_collections.ConfigDict) -> str:
  """The study `config` runs: `benchmark.study`."""
  name = str(config.benchmark.get("study", "family"))
  if name not in STUDIES:
    raise ValueError(f"--config.benchmark.study={name!r}: give one of {', '.join(STUDIES)}")
  return name


def add_defaults(b: ml_collections.ConfigDict, preset: str) -> None:
  """Every study's block `benchmark.<name>` in the benchmark block `b`, with its defaults at `preset`
  (its config.py's `add_defaults`); a study with no fields of its own (the family) has none."""
  for name, package in STUDIES.items():
    block = ml_collections.ConfigDict()
    importlib.import_module(package + ".config").add_defaults(block, preset)
    if block:
      b[name] = block


def known_fields(preset: str) -> set[str]:
  """The dotted fields of a benchmark block (`specs.FIELDS` and every study's block at `preset`; the
  ladder's arms, `ladder.methods` and `ladder.cosine_methods`, are set where `benchmark.arms` is)."""
  b = ml_collections.ConfigDict()
  add_defaults(b, preset)
  return set(specs.FIELDS) | set(config_lib.flatten(b)) | {"ladder.methods", "ladder.cosine_methods"}


def unknown_benchmark_fields(config: ml_collections.ConfigDict) -> list[str]:
  """A line for each key of the benchmark block that is no field of it (`known_fields`), naming the
  nearest: ml_collections adds a key set from Python to an unlocked config (`c.benchmark.method = ...`)
  and the study would run on the field's default, without a word. The arms (`benchmark.arms`, checked by
  `arms.check`) are an open block; `benchmark.ladder.muon`'s keys are optimizer fields. The experiment
  blocks' keys are `config.unknown_field_errors`' (`specs.validate_benchmark` calls it)."""
  b = config.benchmark
  known = known_fields(str(b.get("preset", "long")))
  optim = set(config.get("optim", {}))
  errors = []
  for name in config_lib.flatten(b):
    top = name.split(".")[0]
    if name in known or top == "arms" or top in specs.MOVED or top in specs.OLD_FLAGS and "." not in name:
      continue  # an old name: `specs.moved_errors` names its field now
    if name.startswith("ladder.muon."):
      if name.split(".", 2)[2] in optim:
        continue
      nearest = difflib.get_close_matches(name.split(".", 2)[2], sorted(optim), n=1, cutoff=0.6)
      nearest = ["ladder.muon." + n for n in nearest]
    else:
      nearest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean --config.benchmark.{nearest[0]}? " if nearest else "(docs/benchmark.md lists the fields) "
    errors.append(
      f"--config.benchmark.{name} is not a field of the benchmark block: {hint}A misspelt key would leave the "
      "field it meant at its default; rename or remove it"
    )
  return errors


@dataclasses.dataclass(frozen=True)
class Overwritten:
  """An experiment field the benchmark sets per run (`specs.run_spec`, the tuning): why and the fix,
  and its value in every preset of experiments/configs/benchmark.py where all presets give it one
  (`PER_PRESET` where they differ: then only the command line is checked)."""

  why: str
  preset_value: Any


PER_PRESET = object()  # an `Overwritten.preset_value`: the presets give the field different values
_DEFAULTS = {f.name: f.default for f in config_lib.TOP_FIELDS} | {
  f"trainer.{f.name}": f.default for f in config_lib.TRAINER_FIELDS
}
# Given on the command line (or, from Python, away from every preset's value), they are refused, not ignored.
OVERWRITTEN = {
  "seed": Overwritten(
    "the benchmark sets each run's seed from --config.benchmark.seeds (headline) and "
    "--config.benchmark.tuning_seeds (tuning): leave out --config.seed and set those",
    _DEFAULTS["seed"],
  ),
  "mode": Overwritten(
    "the benchmark sets each run's mode (the anchors train the baseline loop, each method arm in its "
    "arm's mode): leave out --config.mode and name the methods to run in --config.benchmark.methods",
    specs.BENCHMARK_MODE,
  ),
  "trainer.eval_every": Overwritten(
    "the benchmark evaluates each N-step run --config.benchmark.eval_points times and the "
    "other budgets at their end: leave out --config.trainer.eval_every and set --config.benchmark.eval_points",
    PER_PRESET,
  ),
  "trainer.log_every": Overwritten(
    "the benchmark logs each run at its evals (--config.benchmark.eval_points): leave out --config.trainer.log_every",
    PER_PRESET,
  ),
  "trainer.averaging_beta": Overwritten(
    "the benchmark tunes the averaging beta on the tuning seeds over "
    "--config.benchmark.betas: leave out --config.trainer.averaging_beta and set --config.benchmark.betas",
    _DEFAULTS["trainer.averaging_beta"],
  ),
}


def is_speedrun_family(config: ml_collections.ConfigDict) -> bool:
  """Whether `config` is the `speedrun` family (`experiments/configs/benchmark.py:<preset>,speedrun`:
  the whole recipe, `speedrun.speedrun_config`) run as a family."""
  return study_name(config) == "family" and str(config.benchmark.family).startswith("speedrun-")


def _readers(config: ml_collections.ConfigDict, field: str) -> tuple[str, bool]:
  """(who reads the study-block field `field` (dotted, in the benchmark block), whether this config's
  study does)."""
  name, block = study_name(config), field.split(".")[0]
  rungs = arms_lib.names(config.benchmark.ladder.rungs) if "ladder" in config.benchmark else []
  r6, speedrun_family = "R6" in rungs and name == "ladder", is_speedrun_family(config)
  if field in ("recipe.tricks", "recipe.muon_lr"):
    return "the recipe study, the ladder's R6 and the speedrun family", name == "recipe" or r6 or speedrun_family
  if field == "recipe.keep":
    readers = "the recipe, variants, knobs and optimizers studies, the ladder's R6 and the speedrun family"
    return readers, name in ("recipe", "variants", "knobs", "optimizers") or r6 or speedrun_family
  return f"the {block} study", name == block


def unused_field_errors(config: ml_collections.ConfigDict, fields: list[str] = ()) -> list[str]:
  """A line for each field that `fields` (dotted: those the command line set) or, from Python, a
  value away from every preset's (`Overwritten.preset_value`) gives, but that the study would overwrite or never
  read, naming it and the fix: a field the benchmark sets per run (`OVERWRITTEN`), another study's block,
  `benchmark.methods` in a study that runs no method arm (or in a ladder without a tuned rung)."""
  name, b = study_name(config), config.benchmark
  flat = config_lib.flatten(config)
  given = set(fields) | {
    f for f, o in OVERWRITTEN.items() if o.preset_value is not PER_PRESET and f in flat and flat[f] != o.preset_value
  }
  checks = importlib.import_module(STUDIES[name] + ".config")  # a study's own checks, where it has them
  study_reads = checks.reads(config) if hasattr(checks, "reads") else set()
  errors = []
  task = specs.task_name(config)
  try:
    task_reads = tasks_lib.reads(task)
  except ValueError:
    task_reads = None  # a task that does not load: `specs.validate_benchmark` names it
  unread_blocks = [] if task_reads is None else [b for b in tasks_lib.task_blocks() if b not in task_reads]
  if "data" in unread_blocks and flat.get("data.path"):
    given.add("data.path")  # no preset gives a corpus: from Python too, a path is set
  for field in sorted(given):
    if field.split(".")[0] in unread_blocks:
      blocks = " and ".join(f"its {b}" for b in task_reads) if task_reads else "no block of a task's"
      errors.append(
        f"--config.{field}={flat.get(field)!r} is set but unused: --config.benchmark.task={task!r} reads "
        f"{blocks} (its READS), not the {field.split('.')[0]} block, so every run would record it and never read "
        "it. Set the fields the task reads, declare READS in the task's module if it does read this block "
        "(docs/benchmark.md), or use --config.benchmark.task=gpt2"
      )
    if field in OVERWRITTEN:
      if field in study_reads:
        continue  # the study trains some runs at it (the ladder's constant rungs, untuned)
      errors.append(f"--config.{field}={flat.get(field)!r} is set but unused: {OVERWRITTEN[field].why}")
    parts = field.split(".")
    if parts[0] == "benchmark" and len(parts) > 2 and parts[1] in STUDIES:
      readers, read = _readers(config, ".".join(parts[1:]))
      if not read:
        runs = "the family protocol" if name == "family" else f"the {name} study"
        errors.append(
          f"--config.{field}={flat.get(field)!r} is set but unused: it is read by {readers}, and "
          f"--config.benchmark.study={name!r} runs {runs}: add "
          f"--config.benchmark.study={parts[1]} (its study), or leave out --config.{field}"
        )
  errors += unread_optimizer_field_errors(config, fields)
  if "benchmark.methods" in fields and name in ("recipe", "variants", "knobs", "optimizers"):
    errors.append(
      f"--config.benchmark.methods={b.methods!r} is set but unused: the {name} study trains anchors only, no "
      "method arm: run the methods with --config.benchmark.study=family (the protocol) or ladder, or leave out "
      "--config.benchmark.methods"
    )
  if hasattr(checks, "unused_field_errors"):
    errors += checks.unused_field_errors(config, fields)
  return errors


def speedrun_family_errors(config: ml_collections.ConfigDict) -> list[str]:
  """The speedrun family's config against its own recipe: `speedrun.speedrun_config` applied the
  tricks when the config was built; a field a trick derives from that changed after (from Python:
  `c.trainer.steps = 3000` after `get_config('long,speedrun')`), or `benchmark.recipe.tricks`,
  `muon_lr` set after, would leave a value no trick gives this config (the command line's overrides
  are applied before the tricks: `after_command_line` in experiments/configs/benchmark.py)."""
  if not is_speedrun_family(config):
    return []
  kept = set(speedrun.kept_fields(config))
  expected = speedrun.apply_tricks(config, speedrun.tricks_of(config))
  if speedrun.uses_muon(expected) and "optim.learning_rate" not in kept:
    expected.optim.learning_rate = float(config.benchmark.recipe.muon_lr)
  flat, want = config_lib.flatten(config), config_lib.flatten(expected)
  stale = [k for k, v in want.items() if not k.startswith("benchmark.") and flat.get(k) != v]
  if not stale:
    return []
  return [
    "the speedrun family's config is not its recipe's ("
    + ", ".join(f"--config.{k}={flat.get(k)!r} where benchmark.recipe gives {want[k]!r}" for k in stale)
    + "): the tricks were applied before a field they derive from, or benchmark.recipe.tricks/muon_lr, changed. "
    f"Set the fields on the preset without the family (get_config({str(config.benchmark.preset)!r})) and apply "
    "hybridjax.bench.speedrun.speedrun_config to it, or keep a value as given with --config.benchmark.recipe.keep"
  ]


def unread_optimizer_field_errors(config: ml_collections.ConfigDict, fields: list[str]) -> list[str]:
  """A line for each `optim` field the command line set (`fields`, dotted) that no run of the family
  study reads, as `train()` refuses it (`preflight.optimizer_setting_errors`): the anchors' runs
  and every selected arm's (an arm may turn outer momentum on, where `optim.outer_eta` is read). A
  user's task with its own optimizer reads no built-in optimizer field; a cosine schedule reads no
  `optim.decay_fraction`. The other studies train configs of their own (the recipe's tricks change the
  optimizer), which they check themselves."""
  given = sorted({f for f in fields if f.split(".")[0] == "optim"})
  if not given or study_name(config) != "family":
    return []
  try:
    defined = arms_lib.arms(config)
    configs = [arms_lib.base_config(config)] + [
      arms_lib.run_config(config, defined[n]) for n in arms_lib.selected(config)
    ]
  except (KeyError, ValueError):
    return []  # an arm that is not defined: `specs.validate_benchmark` names it
  defaults, flat = preflight.field_defaults(), config_lib.flatten(config)
  errors = []
  for field in given:
    if field not in defaults or flat.get(field) == defaults[field]:
      continue  # a field of no built-in block (the config checks name it), or left at its default
    found = []
    for c in configs:
      if field not in config_lib.flatten(c):
        break  # a field this run's config does not hold: the config checks name it
      reference = ml_collections.ConfigDict(c.to_dict())
      reference.update_from_flattened_dict({field: defaults[field]})  # only this field counts as set
      lines = preflight.optimizer_setting_errors(c, [reference])
      if not lines:
        break
      found.append(lines[0])
    else:
      errors.append(f"{found[0]} (no run of this benchmark reads it: the anchors' nor any arm's)")
  return errors


def validate(config: ml_collections.ConfigDict, command_line: list[str] = ()) -> ModuleType:
  """Checks `config` for its study (`study_name`'s): the benchmark block's keys, the fields it would
  overwrite or not read (`command_line`: the fields the command line set, dotted), the benchmark
  block, the study's block, every other config it trains, before anything is compiled or written;
  returns its `run`."""
  name = study_name(config)
  errors = unknown_benchmark_fields(config) + unused_field_errors(config, list(command_line))
  errors += speedrun_family_errors(config)
  if errors and config.get("hybrid", {}).get("method", ""):
    errors.append(specs.method_field_error(config.hybrid.method))  # else `validate_benchmark` says it
  if errors:
    raise ValueError("; ".join(errors))
  specs.validate_benchmark(config)
  specs.check_user_task(config)  # the anchors train the task's tx without train()
  specs.check_task_seeds(config)
  checks = importlib.import_module(STUDIES[name] + ".config")
  tuners = getattr(checks, "TUNERS", ("lr",))  # the tuners the study reads (`specs.TUNERS`)
  if str(config.benchmark.get("tuner", "lr")) not in tuners:
    raise ValueError(
      f"--config.benchmark.tuner={config.benchmark.tuner!r}: the {name} study tunes with {' or '.join(tuners)}; "
      f"leave --config.benchmark.tuner at 'lr' (or pick a study that runs the joint search: optimizers)"
    )
  for what, other in checks.validate(config).items():
    try:
      specs.validate_benchmark(other)
    except ValueError as e:
      raise ValueError(f"{what} is not a valid run: {e}") from None
  return importlib.import_module(STUDIES[name] + ".run")


def run(
  config: ml_collections.ConfigDict, workdir: str, command: str = "", command_line: list[str] = ()
) -> dict[str, Any]:
  """Runs `config`'s study into `workdir` (and `benchmark.publish`); returns its record.
  `command_line`: the fields the command line set (dotted), which `validate` checks."""
  name = study_name(config)
  study = validate(config, command_line)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  print("\n".join(study.header(config, workdir)), flush=True)
  with make_runner(config, workdir) as runner:
    trained = study.train(config, runner)
  print("--- timing (interleaved, this process)", flush=True)
  timed = study.time_steps(config, trained)
  result = record.header(config, command) | study.record(config, trained, timed, command, runner)
  result |= {"runs_trained": runner.ran, "runs_cached": runner.reused, "wall_s": time.perf_counter() - t_start}
  keep_earlier_report(config, workdir, study.RECORD.format(**result) if study.RECORD else "benchmark.json")
  if study.RECORD:
    earlier = record.stored(os.path.join(workdir, study.RECORD.format(**result))).get("invocations", [])
    keys = ("date", "wall_s", "runs_trained", "runs_cached")
    result["invocations"] = earlier + [{k: result[k] for k in keys}]
  study.write(result, trained, workdir, str(config.benchmark.publish))
  print("\n" + study.markdown(result))
  done = f"{runner.ran} runs trained, {runner.reused} cached"
  print(f"{name} wall time {result['wall_s']:.0f} s ({done}); outputs in {workdir}", flush=True)
  return result


def keep_earlier_report(config: ml_collections.ConfigDict, workdir: str, name: str) -> str | None:
  """Where `workdir` holds a study's record `name` of another config (`record.config_differences`,
  outside the other studies' blocks: another method list, another task...), moves every file of its
  top level (the report: its json, markdown and plots; the run cache and the compilation cache are
  folders, shared) into `<workdir>/earlier-<its date>/`, says so, and returns that folder: a second
  benchmark in a workdir keeps the first's report beside its own. None where there is nothing to keep
  (no record, or one of this config: a re-run, which replaces it)."""
  earlier = record.stored(os.path.join(workdir, name))
  if not earlier:
    return None
  lines = record.config_differences(record.stored_config(earlier), config, record.other_studies(study_name(config)))
  if not lines:
    return None
  stamp = re.sub(r"[^0-9A-Za-z]+", "-", str(earlier.get("date", "undated"))).strip("-")
  folder = os.path.join(workdir, f"earlier-{stamp}")
  os.makedirs(folder, exist_ok=True)
  for entry in sorted(os.listdir(workdir)):
    if os.path.isfile(os.path.join(workdir, entry)):
      os.replace(os.path.join(workdir, entry), os.path.join(folder, entry))
  shown = "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")
  print(f"note: {workdir} held the report of another benchmark ({shown}); it is kept in {folder}", flush=True)
  return folder


_DEPRECATED = "{} is deprecated and goes in the next release: {}"  # an old name on the command line


def current_names(argv: list[str]) -> list[str]:
  """`argv` with the study flags and fields of the release before the study blocks in today's names,
  each with a FutureWarning naming the field now: `--config.benchmark.ladder=True` is
  `--config.benchmark.study=ladder` (`=False`: left out), `--config.benchmark.ladder_rungs=R6` is
  `--config.benchmark.ladder.rungs=R6` (`specs.MOVED`)."""
  out, named = [], {}  # named: each argument that names a study -> the study
  for arg in argv:
    m = re.fullmatch(r"(--(?:no)?config\.benchmark\.)(\w+)(.*)", arg)
    new = arg
    if m and m[2] in specs.MOVED:
      new = m[1] + specs.MOVED[m[2]] + m[3]
      warnings.warn(_DEPRECATED.format(arg.split("=")[0], f"use {new.split('=')[0]}"), FutureWarning, stacklevel=2)
    elif m and m[2] in specs.OLD_FLAGS and m[3][:1] in ("", "="):
      on = m[1] == "--config.benchmark." and m[3].lower() in ("", "=true", "=1")
      new = f"--config.benchmark.study={m[2]}" if on else ""
      warnings.warn(_DEPRECATED.format(arg, f"use {new}" if on else "leave it out"), FutureWarning, stacklevel=2)
    if new.startswith("--config.benchmark.study="):
      named[arg] = new.split("=", 1)[1]
    out += [new] if new else []
  if len(set(named.values())) > 1 and any(not a.startswith("--config.benchmark.study=") for a in named):
    sys.exit(f"error: {' and '.join(named)} name different studies: set --config.benchmark.study alone")
  return out
