"""What the command-line programs (`experiments.gpt2_small`, `experiments.benchmark`) share: their
`--config`/`--workdir` flags, the default run directory, and one error handler."""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable
from typing import Any

import ml_collections
from absl import flags, logging
from ml_collections import config_flags

from hybridjax.loop.train import TrainingDiverged


def define_flags(default_config: str, workdir_help: str) -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """--config (a `get_config(arg)` file, default `default_config`) and --workdir. Call it only
  when run as a program, so importing a CLI module has no side effects."""
  return (
    config_flags.DEFINE_config_file("config", default_config, "Experiment config file[:preset]."),
    flags.DEFINE_string("workdir", "", workdir_help),
  )


def default_workdir(config: ml_collections.ConfigDict, kind: str | None = None) -> str:
  """runs/<preset>-<kind or config.mode>-<time>."""
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{config.preset}-{kind or config.mode}-{stamp}")


def run_as_program(work: Callable[[], Any]) -> None:
  """Runs `work()` as a command-line program: bad input and divergence end in a one-line error.

  Bad input (ValueError, FileNotFoundError; the message says what to change) exits 2, a diverged
  run (`TrainingDiverged`; the message names the step, the count and the fix) exits 3.
  HYBRIDJAX_TRACEBACK=1 re-raises instead.
  """
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  try:
    work()
  except (ValueError, FileNotFoundError) as e:
    if os.environ.get("HYBRIDJAX_TRACEBACK"):
      raise
    print(f"error: {e}\n(set HYBRIDJAX_TRACEBACK=1 to see the traceback)", file=sys.stderr)
    sys.exit(2)
  except TrainingDiverged as e:
    if os.environ.get("HYBRIDJAX_TRACEBACK"):
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(3)
