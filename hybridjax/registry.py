"""Plug-ins loaded by name: training methods (`config.hybrid.method`).

A method is a module of pure functions (`hybridjax/methods/__init__.py` lists the interface). The
built-in ones are named here by their module path and imported with `importlib` when a run asks
for them, as big_vision loads its models and trainers by name; any other name is taken as the dotted
path of a user's module (`--config.hybrid.method=my_pkg.my_method`), so a new method needs no edit of
the package. This module imports nothing of the package: the config checks, the loop and the
benchmark load methods through it without importing any of them.
"""

from __future__ import annotations

import importlib
import types

# name -> module path of the built-in methods.
BUILTIN_METHODS = {
  "velocity": "hybridjax.methods.velocity",
  "jump": "hybridjax.methods.jump",
  "outer_momentum": "hybridjax.methods.outer_momentum",
  "selective_backprop": "hybridjax.methods.selective_backprop",
}

# What every method module must define (the rest of the interface is optional, with defaults).
REQUIRED = ("NAME", "CONFIG_KEY", "default_config", "check", "make_settings", "init", "transitions")
# What a method may declare it reads of the run beyond its own state and the params.
READABLE = frozenset({"averaging", "outer", "opt_state", "per_example_losses"})


def method_path(name: str) -> str:
  """The module path of method `name`: a built-in's, or `name` itself (a user's dotted path)."""
  return BUILTIN_METHODS.get(name, name)


def load_method(name: str) -> types.ModuleType:
  """The method module named `name` (a built-in name or a dotted module path), checked against the
  interface; errors name `--config.hybrid.method` and the fix."""
  path = method_path(name)
  try:
    module = importlib.import_module(path)
  except ModuleNotFoundError as e:
    if e.name is not None and path != e.name and not path.startswith(e.name + "."):
      raise  # the method's module exists but imports something missing: that error is the real one
    raise ValueError(
      f"--config.hybrid.method={name!r} names no method: use a built-in one ({', '.join(BUILTIN_METHODS)}) "
      "or the dotted path of an importable module of yours (e.g. 'my_pkg.my_method'; its folder must be on "
      "sys.path)"
    ) from e
  check_interface(module, name)
  return module


def check_interface(module: types.ModuleType, name: str) -> None:
  """Raises a ValueError listing what `module` lacks to be a method, or declares wrongly."""
  problems = [f"it defines no {attr}" for attr in REQUIRED if not hasattr(module, attr)]
  reads = frozenset(getattr(module, "READS", frozenset()))
  if reads - READABLE:
    problems.append(f"READS names {sorted(reads - READABLE)}, not among {sorted(READABLE)}")
  composes = getattr(module, "COMPOSES_WITH", frozenset())
  if isinstance(composes, str):
    problems.append("COMPOSES_WITH must be a set of method names, not a string")
  per_step = getattr(module, "BATCHES_PER_STEP", 1)
  if isinstance(per_step, bool) or not isinstance(per_step, int) or per_step < 1:
    problems.append(f"BATCHES_PER_STEP must be an int >= 1 (the task's batches a step receives), got {per_step!r}")
  if problems:
    raise ValueError(
      f"--config.hybrid.method={name!r} ({module.__name__}) is not a method: "
      + "; ".join(problems)
      + ". See hybridjax/methods/__init__.py for the interface and docs/methods.md for a complete example."
    )


def batches_per_step(module: types.ModuleType) -> int:
  """How many of the task's batches each step of method `module` receives, concatenated
  (`BATCHES_PER_STEP`, 1 unless declared: e.g. selective backprop scores 2B sequences to train on B)."""
  return int(getattr(module, "BATCHES_PER_STEP", 1))
