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

import importlib
import os
import re
import sys
import time
import warnings
from types import ModuleType
from typing import Any

import ml_collections

from hybridjax.bench import record, specs
from hybridjax.bench.runs.runner import make_runner

STUDIES = {  # name -> the package of its folder
  "family": "hybridjax.bench.studies.family",
  "ladder": "hybridjax.bench.studies.ladder",
  "recipe": "hybridjax.bench.studies.recipe",
  "variants": "hybridjax.bench.studies.variants",
  "knobs": "hybridjax.bench.studies.knobs",
}


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


def validate(config: ml_collections.ConfigDict) -> ModuleType:
  """Checks `config` for its study (`study_name`'s): the benchmark block, the study's block, every
  other config it trains, before anything is compiled or written; returns its `run`."""
  name = study_name(config)
  specs.validate_benchmark(config)
  checks = importlib.import_module(STUDIES[name] + ".config")
  for what, other in checks.validate(config).items():
    try:
      specs.validate_benchmark(other)
    except ValueError as e:
      raise ValueError(f"{what} is not a valid run: {e}") from None
  return importlib.import_module(STUDIES[name] + ".run")


def run(config: ml_collections.ConfigDict, workdir: str, command: str = "") -> dict[str, Any]:
  """Runs `config`'s study into `workdir` (and `benchmark.publish`); returns its record."""
  name = study_name(config)
  study = validate(config)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  print("\n".join(study.header(config, workdir)), flush=True)
  with make_runner(config, workdir) as runner:
    trained = study.train(config, runner)
  print("--- timing (interleaved, this process)", flush=True)
  timed = study.time_steps(config, trained)
  result = record.header(config, command) | study.record(config, trained, timed, command, runner)
  result |= {"runs_trained": runner.ran, "runs_cached": runner.reused, "wall_s": time.perf_counter() - t_start}
  if study.RECORD:
    earlier = record.stored(os.path.join(workdir, study.RECORD.format(**result))).get("invocations", [])
    keys = ("date", "wall_s", "runs_trained", "runs_cached")
    result["invocations"] = earlier + [{k: result[k] for k in keys}]
  study.write(result, trained, workdir, str(config.benchmark.publish))
  print("\n" + study.markdown(result))
  done = f"{runner.ran} runs trained, {runner.reused} cached"
  print(f"{name} wall time {result['wall_s']:.0f} s ({done}); outputs in {workdir}", flush=True)
  return result


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
