"""The benchmark's command line: runs the study `benchmark.study` names (docs/benchmark.md).

python -m experiments.benchmark --config=experiments/configs/benchmark.py:long [--config.benchmark.study=ladder]
python -m experiments.benchmark --quick   # smoke run
python -m experiments.benchmark --config=experiments/configs/benchmark.py:long --config.benchmark.study=optimizers \
  --config.benchmark.optimizers.cell=sides --config.benchmark.tuner=joint \
  --config.benchmark.optimizers.sides=adamw,lion,my_pkg.cautious --json   # any optimizer against AdamW
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import ml_collections
from absl import app, flags

from hybridjax import cli
from hybridjax.bench import specs, speedrun, study

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "benchmark.py")


def run_benchmark(
  config: ml_collections.ConfigDict, workdir: str, command: str = "", command_line: list[str] = ()
) -> dict:
  """`config`'s study (`hybridjax.bench.study.run`): its json, markdown and plots into `workdir`.
  `command_line`: the fields the command line set (dotted); one the study would overwrite or never
  read is refused (`study.unused_field_errors`)."""
  return study.run(config, workdir, command, command_line)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  fields = cli.command_line_fields(sys.argv)
  # A trick of the recipe (and R6) leaves a field the command line set as given; the config file's
  # `after_command_line` (run by the flag parsing) did this already, a config file of yours may not.
  config = speedrun.keep_command_line(_FLAGS[0].value, fields)
  workdir = _FLAGS[1].value or os.path.join("runs", f"benchmark-{config.benchmark.preset}-{config.benchmark.family}")
  command = "python -m experiments.benchmark " + " ".join(sys.argv[1:])
  cli.run_as_program(lambda: print_result(config, workdir, command, fields, _JSON.value))


def print_result(
  config: ml_collections.ConfigDict, workdir: str, command: str, fields: list[str], as_json: bool
) -> None:
  """Runs the benchmark; with `as_json` (`--json`) its page goes to stderr and the record's `table` (the
  optimizers study's cell `sides`: per side, `studies.optimizers.sides.table`), or the whole record, to
  stdout as JSON."""
  if not as_json:
    run_benchmark(config, workdir, command, fields)
    return
  with contextlib.redirect_stdout(sys.stderr):
    result = run_benchmark(config, workdir, command, fields)
  print(json.dumps(result.get("table", result), indent=1, default=str))


def _expand_quick(argv: list[str]) -> list[str]:
  """`--quick` is short for `--config=experiments/configs/benchmark.py:quick`."""
  if "--quick" not in argv:
    return argv
  if any(a.startswith("--config=") or a == "--config" for a in argv):
    sys.exit("error: pass either --quick or --config=..., not both")
  return [f"--config={_CONFIG_PATH}:quick" if a == "--quick" else a for a in argv]


if __name__ == "__main__":
  # Rewritten before the flags exist: config_flags also reads sys.argv for `--config.*` overrides.
  sys.argv = specs.current_names(_expand_quick(sys.argv))
  _FLAGS = cli.define_flags(_CONFIG_PATH + ":long", "Output folder (default: runs/benchmark-<preset>-<family>).")
  _JSON = flags.DEFINE_bool("json", False, "Print the record's table (cell `sides`: per side) as JSON on stdout.")
  cli.run_app(main)
