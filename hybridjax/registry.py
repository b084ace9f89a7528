"""Plug-ins loaded by name: training methods (`config.hybrid.method`).

A method is a module of pure functions (`hybridjax/methods/__init__.py` lists the interface). The
built-in ones are named here by their module path and imported with `importlib` when a run asks
for them, as big_vision loads its models and trainers by name; any other name is taken as the dotted
path of a user's module (`--config.hybrid.method=my_pkg.my_method`), so a new method needs no edit of
the package. `load_method` checks the module against the interface once and returns a `Method`: a
frozen record of its hooks with every optional one's default filled in, which is all the rest of
the package reads. This module imports only `schema` of the package: the config checks, the loop and
the benchmark load methods through it without importing any of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import types
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

from hybridjax import schema

# name -> module path of the built-in methods.
BUILTIN_METHODS = {
  "velocity": "hybridjax.methods.velocity",
  "jump": "hybridjax.methods.jump",
  "outer_momentum": "hybridjax.methods.outer_momentum",
  "selective_backprop": "hybridjax.methods.selective_backprop",
}

# The method a hybrid run trains when `hybrid.method` names none ('').
DEFAULT_METHOD = "velocity"

# What every method module must define (the rest of the interface is optional, with defaults).
REQUIRED = ("NAME", "make_settings", "init")


def _no_errors(config: Any) -> list[str]:
  del config
  return []


def _unchanged(ctx: Any, state: Any, before: Any, after: Any, info: Any) -> Any:
  del ctx, before, after, info
  return state


def _nothing(*args: Any) -> None:
  """The default of a hook that gives nothing (`step_extra`, `log_view`)."""
  del args


def _no_values(*args: Any) -> dict[str, Any]:
  """The default of a hook that gives a dict (`metrics`, `trace`, `log_fields`, `summary`): an empty one."""
  del args
  return {}


@dataclasses.dataclass(frozen=True, eq=False)
class Method:
  """A training method's hooks, resolved once from its module (`load_method`), with every optional
  one's default filled in. `hybridjax/methods/__init__.py` documents each; the module's own names
  are in brackets.

  `full_step`, `predict_step` and `correct_step` are the transitions indexed by `hybrid.phases.Branch`.
  A method that defines no `full_step` gets None here, and the hybrid step uses the baseline's real
  step (`hybrid.real_step.baseline_step`); an undefined `correct_step` or `predict_step` is the
  real step.
  """

  name: str  # [NAME]
  path: str  # its module's dotted path
  make_settings: Callable[..., Any]
  init: Callable[..., Any]
  config_key: str | None = None  # [CONFIG_KEY] its block under config.hybrid, or None
  check: Callable[[Any], list[str]] = _no_errors  # its checks of relations across the whole config
  full_step: Callable[..., Any] | None = None
  predict_step: Callable[..., Any] | None = None
  correct_step: Callable[..., Any] | None = None

  fields: tuple[schema.Field, ...] = ()  # [FIELDS, or CONFIG read by `config_fields`]
  composes_with: frozenset[str] = frozenset()  # [COMPOSES_WITH]
  batches_per_step: int = 1  # [BATCHES_PER_STEP]
  advances_schedule: bool = False  # [ADVANCES_SCHEDULE]
  controller_overrides: Callable[..., Mapping[str, Any]] | None = None  # [control]
  shardings: Callable[..., Any] | None = None  # None: params-shaped subtrees as the params, the rest replicated
  step_extra: Callable[[Any], Any] = _nothing
  on_transition: Callable[..., Any] = _unchanged
  metrics: Callable[..., dict[str, Any]] = _no_values
  trace_only: frozenset[str] = frozenset()  # [TRACE_ONLY]
  trace: Callable[..., dict[str, Any]] = _no_values
  log_view: Callable[[Any], Any] = _nothing
  log_fields: Callable[[Any], dict[str, Any]] = _no_values
  summary: Callable[..., dict[str, Any]] = _no_values

  def default_config(self) -> ml_collections.ConfigDict:
    """Its block (`config.hybrid.<config_key>`) at the declared defaults."""
    return schema.block(self.fields)


# Record field -> the module attribute that defines it (its own name unless listed).
_ATTRIBUTES = {f.name: f.name for f in dataclasses.fields(Method) if f.name != "path"} | {
  "name": "NAME",
  "config_key": "CONFIG_KEY",
  "fields": "FIELDS",
  "composes_with": "COMPOSES_WITH",
  "batches_per_step": "BATCHES_PER_STEP",
  "advances_schedule": "ADVANCES_SCHEDULE",
  "controller_overrides": "control",
  "trace_only": "TRACE_ONLY",
}


def method_path(name: str) -> str:
  """The module path of method `name`: a built-in's, or `name` itself (a user's dotted path)."""
  return BUILTIN_METHODS.get(name, name)


def load_plugin(name: str, builtin: Mapping[str, str], flag: str, what: str) -> types.ModuleType:
  """The module of plug-in `name`: a built-in's (`builtin`: name -> module path) or a user's dotted
  module path. A name that imports nothing gets a ValueError naming `flag` (e.g.
  '--config.hybrid.method') and the fix; a module that exists but imports something missing raises
  that error itself."""
  path = builtin.get(name, name)
  try:
    return importlib.import_module(path)
  except ModuleNotFoundError as e:
    if e.name is not None and path != e.name and not path.startswith(e.name + "."):
      raise  # the plug-in's module exists but imports something missing: that error is the real one
    close = difflib.get_close_matches(name, builtin, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
      f"{flag}={name!r} names no {what}{hint}: use a built-in one ({', '.join(builtin)}) or the dotted path of an "
      f"importable module of yours (e.g. 'my_pkg.my_{what}'; its folder must be on sys.path)"
    ) from e


@functools.cache
def load_method(name: str) -> Method:
  """The method named `name` (a built-in name or a dotted module path), checked against the
  interface; errors name `--config.hybrid.method` and the fix."""
  return method_record(load_plugin(name, BUILTIN_METHODS, "--config.hybrid.method", "method"), name)


def config_fields(declaration: Mapping[str, tuple[Any, schema.Check]]) -> tuple[schema.Field, ...]:
  """The fields of a block a user's method declares as `CONFIG = {dotted field: (default, check)}`
  (docs/methods.md): the `schema.Field`s the built-in methods declare as `FIELDS`, with no doc."""
  return tuple(schema.Field(name, default, check, "") for name, (default, check) in declaration.items())


def method_record(module: types.ModuleType, name: str) -> Method:
  """`module` as a `Method`; a ValueError lists what it lacks to be one, or declares wrongly."""
  problems = [f"it defines no {attr}" for attr in REQUIRED if not hasattr(module, attr)]
  if hasattr(module, "transitions"):
    problems.append("transitions(ctx) is no longer read: define full_step, predict_step and correct_step")
  if hasattr(module, "real_step"):  # the earlier name: read as nothing, it would train the baseline's step
    problems.append("it defines real_step, the earlier name of the real transition: rename it full_step")
  hooks = {field: getattr(module, attr) for field, attr in _ATTRIBUTES.items() if hasattr(module, attr)}
  if getattr(getattr(module, "default_config", None), "__module__", None) == module.__name__:  # its own, not imported
    problems.append("default_config() is no longer read: declare the block's fields in CONFIG (or FIELDS)")
  if hasattr(module, "CONFIG"):  # a user's block: {field: (default, check)}
    if "fields" in hooks:
      problems.append("CONFIG and FIELDS both declare the block: keep one")
    hooks["fields"] = config_fields(module.CONFIG)
  fields = hooks.get("fields", ())
  if isinstance(fields, Mapping) or not all(isinstance(f, schema.Field) for f in fields):
    problems.append("FIELDS must be a tuple of hybridjax.schema.Field (or declare CONFIG = {field: (default, check)})")
  elif fields and not hooks.get("config_key"):
    problems.append("it has a config block but no CONFIG_KEY (its key under config.hybrid)")
  if isinstance(hooks.get("composes_with"), str):
    problems.append("COMPOSES_WITH must be a set of method names, not a string")
  per_step = hooks.get("batches_per_step", 1)
  if not schema.is_int(per_step) or per_step < 1:
    problems.append(f"BATCHES_PER_STEP must be an int >= 1 (the task's batches a step receives), got {per_step!r}")
  for hook in ("full_step", "predict_step", "correct_step", "step_extra", "on_transition", "metrics", "summary"):
    if hook in hooks and not callable(hooks[hook]):
      problems.append(f"{hook} must be a function, got {type(hooks[hook]).__name__}")
  if problems:
    raise ValueError(
      f"--config.hybrid.method={name!r} ({module.__name__}) is not a method: "
      + "; ".join(problems)
      + ". See hybridjax/methods/__init__.py for the interface and docs/methods.md for a complete example."
    )
  hooks |= {k: frozenset(hooks.get(k, ())) for k in ("composes_with", "trace_only")}
  hooks["fields"] = tuple(fields)
  return Method(path=module.__name__, **hooks)


# --- a method module's names ---------------------------------------------------------------------

# The module-level names the method interface reads (`registry.method_record`, and those
# hybridjax/methods/__init__.py lists for readers other than the loop), and the earlier names it refuses.
INTERFACE_NAMES = frozenset(_ATTRIBUTES.values()) | {"CONFIG", "CONTROL", "TIME_BRANCHES", "step_kind"}
# How close (difflib's ratio, compared lower-case) a name must be to an interface name to be taken
# for a misspelling of it: `predict` for `predict_step` is 0.74.
NEAR_NAME_CUTOFF = 0.7


def misspelt_hook_errors(module: types.ModuleType, method_name: str) -> list[str]:
  """A line for each public module-level name of a method's module that closely matches a name of
  the method interface (`INTERFACE_NAMES`) but is not one: the interface reads the exact name, so
  `def predict(...)` for `predict_step` or `ADVANCE_SCHEDULE` for `ADVANCES_SCHEDULE` would leave
  the hook at its default (the real step; no schedule advance) without a word. Submodules and
  functions imported from elsewhere are not the module's own and are skipped; so is any name with a
  leading underscore (the escape for a helper whose name happens to be near one)."""
  lower = {n.lower(): n for n in INTERFACE_NAMES}
  errors = []
  for name, value in sorted(vars(module).items()):
    if name.startswith("_") or name in INTERFACE_NAMES or isinstance(value, types.ModuleType):
      continue
    if callable(value) and getattr(value, "__module__", module.__name__) != module.__name__:
      continue  # imported (`from x import f`): another module's name
    near = difflib.get_close_matches(name.lower(), lower, n=1, cutoff=NEAR_NAME_CUTOFF)
    if near:
      meant = lower[near[0]]
      errors.append(
        f"--config.hybrid.method={method_name!r} ({module.__name__}) defines {name}, which the method interface "
        f"does not read: did you mean {meant}? As spelt, {meant} stays at its default. Rename it to {meant}, or "
        f"to _{name} if it is a helper of your own (docs/methods.md lists the interface)"
      )
  return errors


def check_method_names(method: Method) -> None:
  """Refuses a user's method whose module defines a near-miss of an interface name
  (`misspelt_hook_errors`). The built-in methods are the test suite's to check."""
  if method.path in BUILTIN_METHODS.values():
    return
  schema.raise_invalid(
    misspelt_hook_errors(importlib.import_module(method.path), method.name) + builtin_name_errors(method)
  )


def builtin_name_errors(method: Method) -> list[str]:
  """The errors of a user's method whose NAME or CONFIG_KEY is a built-in method's: the run's
  record and summary would name the built-in method while the user's trained, and a shared block
  would mix the two methods' fields."""
  errors = []
  if method.name in BUILTIN_METHODS:
    errors.append(
      f"--config.hybrid.method={method.path!r} declares NAME = {method.name!r}, the built-in method's name: its "
      f"runs' records and summaries would say {method.name!r} trained; give NAME a name of its own in {method.path}"
    )
  builtin_keys = {load_method(name).config_key: name for name in BUILTIN_METHODS}
  if method.config_key and method.config_key in builtin_keys:  # a method without a block shares none
    errors.append(
      f"--config.hybrid.method={method.path!r} declares CONFIG_KEY = {method.config_key!r}, the block of the "
      f"built-in method {builtin_keys[method.config_key]!r} (--config.hybrid.{method.config_key}.*): give "
      f"CONFIG_KEY a key of its own in {method.path}"
    )
  return errors
