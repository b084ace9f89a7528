"""The benchmark's command line: runs the study `benchmark.study` names (docs/benchmark.md).

python -m experiments.benchmark --config=experiments/configs/benchmark.py:long [--config.benchmark.study=ladder]
python -m experiments.benchmark --quick   # smoke run
"""

from __future__ import annotations

import os
import re
import sys
import warnings

import ml_collections
from absl import app

from hybridjax import cli
from hybridjax.bench import specs, speedrun, study

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "benchmark.py")
_DEPRECATED = "{} is deprecated and goes in the next release: {}"  # an old name on the command line


def run_benchmark(config: ml_collections.ConfigDict, workdir: str, command: str = "") -> dict:
  """`config`'s study (`hybridjax.bench.study.run`): its json, markdown and plots into `workdir`."""
  return study.run(config, workdir, command)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # A trick of the recipe (and R6) leaves a field the command line set as given.
  config = speedrun.keep_command_line(_FLAGS[0].value, cli.command_line_fields(sys.argv))
  workdir = _FLAGS[1].value or os.path.join("runs", f"benchmark-{config.benchmark.preset}-{config.benchmark.family}")
  command = "python -m experiments.benchmark " + " ".join(sys.argv[1:])
  cli.run_as_program(lambda: run_benchmark(config, workdir, command))


def _expand_quick(argv: list[str]) -> list[str]:
  """`--quick` is short for `--config=experiments/configs/benchmark.py:quick`."""
  if "--quick" not in argv:
    return argv
  if any(a.startswith("--config=") or a == "--config" for a in argv):
    sys.exit("error: pass either --quick or --config=..., not both")
  return [f"--config={_CONFIG_PATH}:quick" if a == "--quick" else a for a in argv]


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


if __name__ == "__main__":
  # Rewritten before the flags exist: config_flags also reads sys.argv for `--config.*` overrides.
  sys.argv = current_names(_expand_quick(sys.argv))
  _FLAGS = cli.define_flags(_CONFIG_PATH + ":long", "Output folder (default: runs/benchmark-<preset>-<family>).")
  cli.run_app(main)
