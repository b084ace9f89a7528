"""What the command-line programs (`experiments.gpt2_small`, `experiments.benchmark`) share: their
`--config`/`--workdir` flags, the default run directory, and one error handler."""

from __future__ import annotations

import datetime
import difflib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import ml_collections
from absl import app, flags, logging
from ml_collections.config_flags import config_flags as config_flags_impl

from hybridjax import config as config_lib
from hybridjax.loop.train import TrainingDiverged, TrainingInterrupted


def override_value(argv: list[str], field: str) -> str | None:
  """The last value `argv` gives `--config.<field>` (as `--config.f=v` or `--config.f v`), or None."""
  value = None
  for i, arg in enumerate(argv):
    if arg.startswith(f"--config.{field}="):
      value = arg.split("=", 1)[1]
    elif arg == f"--config.{field}" and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def command_line_fields(argv: list[str]) -> list[str]:
  """The config fields `argv` sets, as dotted names ('a.b': `--config.a.b=...`, `--config.a.b ...`,
  `--noconfig.a.b`)."""
  return [m[1] for arg in argv if (m := re.match(r"^--?(?:no)?config\.([^=]+)", arg))]


# A config file's hook that makes its config ready for the command line's overrides of blocks of its own
# (config, argv) -> {path: error} for the paths of argv it finds no field of.
PrepareHook = Callable[[ml_collections.ConfigDict, list[str]], dict[str, str]]


def prepare_for_overrides(
  config: ml_collections.ConfigDict, argv: list[str], prepare: PrepareHook | None = None
) -> ml_collections.ConfigDict:
  """`config` made ready for `argv`'s `--config.*` overrides, which ml_collections applies while it
  parses the flags, only to fields that exist: the block of the method `--config.hybrid.method`
  names (a user's method brings its own, at its defaults), then the config file's own `prepare`
  (its `prepare_overrides`, e.g. the benchmark's arms). An override of a field that still does not
  exist is refused here, naming it and the nearest field (a misspelt key would leave the field it
  meant at its default)."""
  method = override_value(argv, "hybrid.method")
  if method is not None and "hybrid" in config:
    config.hybrid.method = method
    config = config_lib.with_method_block(config)
  judged = prepare(config, argv) if prepare else {}
  fields = sorted(config_lib.flatten(config))
  errors = []
  for path in command_line_fields(argv):
    if path in judged:
      errors.append(judged[path])
    elif path not in fields and not any(f.startswith(path + ".") for f in fields):
      block, _, leaf = path.rpartition(".")
      keys = [f.rpartition(".")[2] for f in fields if f.rpartition(".")[0] == block]
      # a field's initials first (`optim.lr`: `learning_rate`), then the nearest spelling, else the block's fields
      nearest = [f"{block}.{k}" for k in keys if "".join(w[:1] for w in k.split("_")) == leaf]
      nearest += difflib.get_close_matches(path, fields, n=1, cutoff=0.6)
      hint = f"the {block} block holds {keys}" if block and keys else "docs/config.md lists the fields"
      hint = f"did you mean --config.{nearest[0]}?" if nearest else hint
      if block.startswith("hybrid.") and (sub := block.split(".")[1]) not in config.get("hybrid", {}):
        hint += f" (a method's block exists once --config.hybrid.method names the method that declares {sub!r})"
      errors.append(f"--config.{path} is not a field of the config: {hint}")
  if errors:
    raise ValueError("\n".join(errors))
  return config


class _ConfigFileParser(config_flags_impl.ConfigFileFlagParser):
  """The config file's `get_config(arg)`, given its `before_command_line(config, arg, overrides)` if it has
  one (blocks the command line's values name, {field: value}), made ready for the command line's overrides
  (`prepare_for_overrides`, with the file's `prepare_overrides(config, argv)` where it has one), then locked;
  the file's `after_command_line(config, arg, fields)`, if it has one, is kept for `finish_config`."""

  after_command_line: Callable[[ml_collections.ConfigDict, list[str]], ml_collections.ConfigDict] | None = None

  def parse(self, path: str) -> ml_collections.ConfigDict:
    config = super().parse(path)
    if isinstance(config, ml_collections.ConfigDict):
      file, _, arg = path.partition(":")
      # The file as a module, executed again: `super().parse` does not keep the one it loads.
      spec = importlib.util.spec_from_file_location(f"{self.name}_config_hooks", file)
      hooks = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(hooks)
      if before := getattr(hooks, "before_command_line", None):
        config = before(  # the command line's {field: value}
          config, arg, {p: v for p in command_line_fields(sys.argv) if (v := override_value(sys.argv, p)) is not None}
        )
      config = prepare_for_overrides(config, sys.argv, getattr(hooks, "prepare_overrides", None))
      config.lock()
      hook = getattr(hooks, "after_command_line", None)
      self.after_command_line = None if hook is None else lambda c, fields: hook(c, arg, fields)
    return config


def finish_config(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Once the flags are parsed: the config file's `after_command_line(config, arg, fields)` (where it
  has one) given the config with the command line's overrides applied and the fields `argv` sets;
  what it returns is written into the `--config` flag's config. A preset whose values derive from
  others (the speedrun recipe's tricks: a warm-up in proportion to `trainer.steps`, an attention
  scale from the head dimension) computes them again there, so that they follow the overrides."""
  if "config" not in flag_values:
    return
  flag = flag_values["config"]
  hook = getattr(flag.parser, "after_command_line", None)
  if hook is None or not isinstance(flag.value, ml_collections.ConfigDict):
    return
  config = flag.value
  finished = config_lib.flatten(hook(config, command_line_fields(argv)))
  current = config_lib.flatten(config)
  config.update_from_flattened_dict({k: v for k, v in finished.items() if current.get(k) != v})


def define_flags(default_config: str, workdir_help: str) -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """--config (a `get_config(arg)` file, default `default_config`; its overrides may set a user's
  method's fields, `prepare_for_overrides`) and --workdir. Call it only when run as a program, so
  importing a CLI module has no side effects."""
  # As `config_flags.DEFINE_config_file` builds it, with the parser that prepares the config.
  try:  # without --config on the command line, the default file is loaded (and overridden) here
    flag = config_flags_impl._ConfigFlag(  # noqa: SLF001 (no public hook runs between loading and overriding)
      parser=_ConfigFileParser(name="config", lock_config=False),
      serializer=flags.ArgumentSerializer(),
      name="config",
      default=default_config,
      help_string="Experiment config file[:preset].",
      flag_values=flags.FLAGS,
    )
  except flags.Error as e:
    _flag_error(e)
  return (
    flags.DEFINE_flag(flag, flags.FLAGS),
    flags.DEFINE_string("workdir", "", workdir_help),
  )


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, then the config file's `after_command_line` (`finish_config`), with a
  mistake on the command line (a misspelt field, a value of the wrong type, a field the program
  refuses) ending as every bad input does: the message, and exit status 2."""
  try:
    rest = flags.FLAGS(argv)
    finish_config(argv)
  except (flags.Error, ValueError) as e:  # ValueError: a block's own check of a value it is given
    _flag_error(e)
  return rest


def _flag_error(e: Exception) -> NoReturn:
  message = str(e)
  if "Traceback (most recent call last)" in message:
    # ml_collections quotes the config file's whole traceback: its bad-input error is the last line.
    head, _, tail = message.partition("Traceback (most recent call last)")
    last = [line for line in tail.splitlines() if line.strip()][-1]
    message = head.split("Error whilst parsing config file")[0] + last.split(": ", 1)[-1]
  print(f"error: {message}\n(--helpfull lists the flags; docs/config.md the config's fields)", file=sys.stderr)
  sys.exit(2)


def run_app(main: Callable[[list[str]], None]) -> None:
  """`absl.app.run(main)` with `parse_flags`."""
  app.run(main, flags_parser=parse_flags)


def default_workdir(config: ml_collections.ConfigDict, kind: str | None = None) -> str:
  """runs/<preset>-<kind or config.mode>-<time>."""
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{config.preset.replace(',', '-')}-{kind or config.mode}-{stamp}")


def run_as_program(work: Callable[[], Any]) -> None:
  """Runs `work()` as a command-line program: bad input and divergence end in a one-line error.

  Bad input (ValueError, FileNotFoundError; the message says what to change) exits 2, a diverged
  run (`TrainingDiverged`; the message names the step, the count and the fix) exits 3, a run stopped
  by SIGINT or SIGTERM (`TrainingInterrupted`, once saved) exits 130 or 143, as does a Ctrl-C
  elsewhere (130).
  HYBRIDJAX_TRACEBACK=1 re-raises instead.
  """
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  try:
    work()
  except TrainingInterrupted as e:  # saved, then stopped: the shell's status for the signal
    print(e, file=sys.stderr)
    sys.exit(e.exit_code)
  except (ValueError, FileNotFoundError, TrainingDiverged, KeyboardInterrupt) as e:
    if os.environ.get("HYBRIDJAX_TRACEBACK"):
      raise
    if isinstance(e, KeyboardInterrupt):
      message, status = "interrupted (run the same command again to resume from what it saved)", 130
    elif isinstance(e, TrainingDiverged):
      message, status = f"error: {e}", 3
    else:
      message, status = f"error: {e}\n(set HYBRIDJAX_TRACEBACK=1 to see the traceback)", 2
    print(message, file=sys.stderr)
    sys.exit(status)
