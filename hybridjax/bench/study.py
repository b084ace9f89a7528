"""The benchmark's skeleton, written once for every study (`benchmark.study`): check the config, make
the runner, train, time, build the record (its header here, its figures the study's), write its json,
markdown and plots (and the published copy), print it.

A study is a folder `studies/<name>/` and a line in `STUDIES`. Its `config.py` has `add_defaults(b,
preset)` (its fields of the benchmark block) and `validate(config)`, which checks them and returns the
other configs it trains (checked here like the config itself);
its `run.py` has `header(config, workdir)` (the lines printed first), `train(config, runner)`,
`time_steps(config, trained)`, `record(config, trained, timed, command, runner)`,
`write(result, trained, workdir, publish)`, `markdown(result)` and `RECORD` (its json, whose
invocations a resumed study extends; None: it keeps none).
"""

from __future__ import annotations

import importlib
import os
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
}
OLD_FLAGS = ("ladder", "recipe")  # `benchmark.ladder` / `benchmark.recipe`: `benchmark.study` before it existed


def study_name(config: ml_collections.ConfigDict) -> str:
  """The study `config` runs: `benchmark.study`, or a study's old flag (with a warning naming the field)."""
  b = config.benchmark
  name = str(b.get("study", "family"))
  flags = [f for f in OLD_FLAGS if b.get(f, False)]
  if len(flags) > 1:
    raise ValueError(
      "--config.benchmark.ladder and --config.benchmark.recipe are both set: run one study, with "
      "--config.benchmark.study=ladder or --config.benchmark.study=recipe"
    )
  if flags:
    if name not in ("family", flags[0]):
      raise ValueError(
        f"--config.benchmark.{flags[0]}=True and --config.benchmark.study={name!r} name different studies: "
        "set --config.benchmark.study alone"
      )
    warnings.warn(
      f"--config.benchmark.{flags[0]}=True is deprecated and goes in the next release: "
      f"use --config.benchmark.study={flags[0]}",
      FutureWarning,
      stacklevel=2,
    )
    name = flags[0]
  if name not in STUDIES:
    raise ValueError(f"--config.benchmark.study={name!r}: give one of {', '.join(STUDIES)}")
  return name


def add_defaults(b: ml_collections.ConfigDict, preset: str) -> None:
  """Every study's fields of the benchmark block `b`, with their defaults at `preset` (its config.py)."""
  for package in STUDIES.values():
    importlib.import_module(package + ".config").add_defaults(b, preset)


def validate(config: ml_collections.ConfigDict, name: str | None = None) -> ModuleType:
  """Checks `config` for its study (`name`, else `study_name`'s): the benchmark block, the study's
  fields, every other config it trains, before anything is compiled or written; returns its `run`."""
  name = name or study_name(config)
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
  name = study_name(config)  # once: an old flag warns once
  study = validate(config, name)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  for line in study.header(config, workdir):
    print(line, flush=True)
  with make_runner(config, workdir) as runner:
    trained = study.train(config, runner)
  print("--- timing (interleaved, this process)", flush=True)
  timed = study.time_steps(config, trained)
  result = record.header(config, command) | study.record(config, trained, timed, command, runner)
  result |= {"runs_trained": runner.ran, "runs_cached": runner.reused, "wall_s": time.perf_counter() - t_start}
  if study.RECORD:
    earlier = record.earlier_invocations(os.path.join(workdir, study.RECORD.format(**result)))
    keys = ("date", "wall_s", "runs_trained", "runs_cached")
    result["invocations"] = earlier + [{k: result[k] for k in keys}]
  study.write(result, trained, workdir, str(config.benchmark.publish))
  print("\n" + study.markdown(result))
  print(
    f"{name} wall time {result['wall_s']:.0f} s ({runner.ran} runs trained, {runner.reused} cached); "
    f"outputs in {workdir}",
    flush=True,
  )
  return result
