"""Benchmark arms as data: what each method arm changes in a run's config, and its step kinds.

An arm is an entry of `config.benchmark.arms` (the experiment's config file writes them; this library
names no method):

  method      a method's name or module path (`registry.load_method`)
  mode        'hybrid' (the default), or 'baseline' when the method's steps are the baseline loop's
              own (outer momentum lives in the optimizer layer)
  overrides   a block merged into the run's config, e.g. {'hybrid': {'jump': {'forecast': 'rssm'}}}
  control     True: the method's control arm (its `CONTROL` overrides applied after the overrides)
  control_of  the arm this one is the control of: that arm's figures get the paired final-loss
              difference from this one

`config.benchmark.methods` names the arms a benchmark runs, the headline's first.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from ml_collections import ConfigDict

from hybridjax import config as config_lib
from hybridjax import preflight, registry
from hybridjax.bench import tasks as tasks_lib
from hybridjax.hybrid.phases import BRANCH_NAMES

REAL_STEP = "real_step"  # the one step kind of an arm that trains in baseline mode


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str
  method: str
  mode: str = "hybrid"
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # flattened: 'hybrid.jump.forecast'
  control: bool = False
  control_of: str = ""


def declared(method: registry.Method, name: str, default: Any = None) -> Any:
  """What `method`'s module declares as `name`, of the names the arms read and the loop does not:
  `CONTROL` (the config overrides under config.hybrid that make its control arm; None: no control
  arm), `TIME_BRANCHES` and `step_kind` (`timing`)."""
  return getattr(importlib.import_module(method.path), name, default)


def arms(config: ConfigDict) -> dict[str, Arm]:
  """Every arm the config defines, by name: the entries of `benchmark.arms`, and for each method
  that `benchmark.methods` names by its module path (or built-in name) rather than by an arm, the
  arm named by the method's `NAME` and, where it declares a `CONTROL`, its control arm
  `<NAME>_control`."""
  out = {
    name: Arm(
      name=name,
      method=str(a.get("method", "")),
      mode=str(a.get("mode", "hybrid")),
      overrides=config_lib.flatten(a.get("overrides") or {}),
      control=bool(a.get("control", False)),
      control_of=str(a.get("control_of", "")),
    )
    for name, a in config.benchmark.get("arms", {}).items()
  }
  # A control arm is its arm with the method's CONTROL: its arm's overrides first, then its own.
  for name, arm in list(out.items()):
    if arm.control and arm.control_of in out:
      out[name] = dataclasses.replace(arm, overrides={**out[arm.control_of].overrides, **arm.overrides})
  for entry, method in _methods_named(config, out).items():
    out.setdefault(method.name, Arm(name=method.name, method=entry))
    if declared(method, "CONTROL"):
      control = f"{method.name}_control"
      out.setdefault(control, Arm(name=control, method=entry, control=True, control_of=method.name))
  return out


def _methods_named(config: ConfigDict, defined: dict[str, Arm]) -> dict[str, registry.Method]:
  """The entries of `benchmark.methods` that name no arm of `defined` but load as a method."""
  out = {}
  for entry in names(config.benchmark.get("methods", "")):
    if entry in defined:
      continue
    try:
      out[entry] = registry.load_method(entry)
    except ValueError:
      continue  # `selected` names it
  return out


def names(text: str) -> list[str]:
  """The names of a comma-separated field (`benchmark.methods`, `ladder.rungs`, `recipe.tricks`)."""
  return [x.strip() for x in str(text).split(",") if x.strip()]


def selected(config: ConfigDict) -> list[str]:
  """The arms `benchmark.methods` names, in its order: an arm's name, or a method's module path,
  which selects the method's arm and its control arm (`arms`). Errors name the field and the arms."""
  defined = arms(config)
  explicit = {name: arm for name, arm in defined.items() if name in config.benchmark.get("arms", {})}
  chosen, listed = [], names(config.benchmark.methods)
  for entry in listed:
    if entry in explicit:
      chosen.append(entry)
      # Its control arm `<name>_control` (one the command line made from the method's CONTROL) runs with it.
      control = explicit.get(f"{entry}_control")
      if control is not None and control.control_of == entry and control.name not in listed:
        chosen.append(control.name)
      continue
    method = _methods_named(config, explicit).get(entry)
    if method is None:
      chosen.append(entry)  # refused below
      continue
    arm = defined[method.name]
    if arm.method != entry:
      raise ValueError(
        f"--config.benchmark.methods: method {entry!r} is named {method.name!r}, the name of an arm of "
        f"benchmark.arms that runs {arm.method!r}: rename one of them (the method's NAME, or the arm)"
      )
    chosen.append(method.name)
    if declared(method, "CONTROL"):
      chosen.append(f"{method.name}_control")
  if not set(chosen) <= set(defined) or len(set(chosen)) != len(chosen):
    raise ValueError(
      f"--config.benchmark.methods={config.benchmark.methods!r}: give distinct names from "
      f"{','.join(defined)} (the arms of benchmark.arms), a built-in method's name or the module path "
      "of a method of yours (e.g. my_pkg.my_method: its arm and its control arm), or '' for the anchors only"
    )
  return chosen


def check(config: ConfigDict) -> list[str]:
  """The arms' problems: a method that does not load, an unknown mode, a baseline-mode arm whose method
  has steps of its own (it would train the plain baseline under the method's name), a control without
  one or with an empty one, and a hybrid arm's run config that is not valid (`config.validate`), or a
  control arm's equal to its arm's (the method's CONTROL changes nothing: the comparison would test
  nothing; `run_error`)."""
  errors = []
  defined = arms(config)
  empty: set[str] = set()  # the methods whose CONTROL = {} is named already
  runs: dict[str, list[str]] = {}  # a run config's problem -> the arms that have it
  try:
    preflight.validate(base_config(config))
    base_valid = True
  except ValueError:
    base_valid = False  # `specs.validate_benchmark` names it, once: not again in every arm's run config
  for arm in defined.values():
    if not arm.method:
      errors.append(f"benchmark.arms.{arm.name}.method is missing: set --config.benchmark.arms.{arm.name}.method=")
      continue
    try:
      method = registry.load_method(arm.method)
    except ValueError as e:
      errors.append(f"benchmark.arms.{arm.name}.method: {e}")
      continue
    if arm.mode not in ("hybrid", "baseline"):
      errors.append(f"benchmark.arms.{arm.name}.mode must be 'hybrid' or 'baseline', got {arm.mode!r}")
    elif arm.mode == "baseline" and (own := transitions(method)):
      errors.append(
        f"--config.benchmark.arms.{arm.name}.mode='baseline' trains the baseline loop's own steps, but method "
        f"{arm.method!r} defines its own ({', '.join(own)}): the arm would train the plain baseline under the "
        f"method's name; set --config.benchmark.arms.{arm.name}.mode=hybrid (baseline mode is for a method that "
        "defines none of them, whose steps are the baseline's)"
      )
    control = declared(method, "CONTROL")
    if control is not None and not control and arm.method not in empty:
      empty.add(arm.method)
      errors.append(
        f"{where(config, arm)}: method {arm.method!r} ({method.path}) declares CONTROL = {{}}, a "
        f"control arm that changes nothing: give CONTROL in {method.path} the fields under config.hybrid that "
        f"remove the method's effect (e.g. {example(method)}), or leave CONTROL out for no control arm"
      )
    if arm.control and not control:
      errors.append(f"benchmark.arms.{arm.name}.control: method {arm.method!r} declares no CONTROL arm")
    elif arm.control and arm.mode == "baseline":
      errors.append(
        f"--config.benchmark.arms.{arm.name}.control: a baseline-mode arm reads nothing under config.hybrid, so "
        f"method {arm.method!r}'s CONTROL would change nothing: set --config.benchmark.arms.{arm.name}.mode=hybrid"
      )
    elif arm.mode == "hybrid" and base_valid and (found := run_error(config, arm, method)):
      at, problem = found
      runs.setdefault(problem, []).append(at)
    if arm.control_of and arm.control_of not in defined:
      errors.append(f"benchmark.arms.{arm.name}.control_of names no arm: {arm.control_of!r}")
  # A problem every arm shares (a hybrid setting of the experiment config) is named once, with its arms.
  return errors + [f"{', '.join(arms_named)}: {problem}" for problem, arms_named in runs.items()]


def transitions(method: registry.Method) -> list[str]:
  """The transitions `method` defines of its own (`full_step`, `predict_step`, `correct_step`): none for
  a method whose steps are the baseline's (outer momentum)."""
  return [name for name in BRANCH_NAMES if getattr(method, name) is not None]


def predicts(arm: Arm) -> bool:
  """Whether `arm` is meant to predict steps (take steps without a backward pass), so that runs which
  predicted (nearly) none did not exercise it (`figures.exercise`): a hybrid-mode arm whose method
  defines a `predict_step`. Outer momentum and selective backprop define none (their every step is a
  real one, and their `control` turns predicting off): they never predict by design. False for a
  method that does not load here (a record read where its module is not importable)."""
  if arm.mode != "hybrid":
    return False
  try:
    return registry.load_method(arm.method).predict_step is not None
  except ValueError:
    return False


def base_config(config: ConfigDict) -> ConfigDict:
  """The experiment part of benchmark config `config` (`bench.specs.experiment_config`): without its benchmark
  block, in baseline mode, with the task's own optimizer (its name is part of what every run is)."""
  c = ConfigDict(config.to_dict())
  del c.benchmark
  c.mode = "baseline"
  try:
    optimizer = tasks_lib.optimizer_name(str(config.benchmark.get("task", "gpt2")))
  except ValueError:
    optimizer = None  # a task that does not load: `specs.validate_benchmark` names it
  if optimizer is not None:
    c.optim.name = optimizer
  return c


def run_config(config: ConfigDict, arm: Arm) -> ConfigDict:
  """The experiment config a run of `arm` trains, as `bench.specs.run_spec` makes it (but for its seed,
  LR and budget): `base_config` made the arm's (`apply`)."""
  c = base_config(config)
  apply(arm, c)
  return c


def run_error(config: ConfigDict, arm: Arm, method: registry.Method) -> tuple[str, str] | None:
  """The problem of `arm`'s run config (`config.validate`'s), or for a control arm that of its CONTROL:
  one the run config cannot take or that makes it invalid (a misspelt key, a path written with
  'hybrid.'), or one that leaves it equal to the arm's own without CONTROL (the control would train the
  method itself). As (the arm, the problem), naming the method's module and its CONTROL entry, and the
  fix; None where there is none."""
  at = where(config, arm)
  try:
    own = run_config(config, dataclasses.replace(arm, control=False, control_of=""))
    preflight.validate(own)
  except ValueError as e:
    return at, f"the arm's run config is not valid: {one_line(e)}"
  if not arm.control:
    return None
  control = dict(declared(method, "CONTROL") or {})
  explicit = arm.name in config.benchmark.get("arms", {})
  at = f"{at}, the control arm of method {arm.method!r}" if explicit else f"control {at}"
  try:
    c = run_config(config, arm)
  except ValueError as e:  # `apply`'s: a CONTROL key config.hybrid cannot take
    return at, str(e)
  try:
    preflight.validate(c)
  except ValueError as e:
    return at, (
      f"{method.path}'s CONTROL = {control!r} makes no valid run: {one_line(e)}. Fix CONTROL in "
      f"{method.path} (its keys are dotted fields under config.hybrid, without 'hybrid.')"
    )
  if config_lib.flatten(c) == config_lib.flatten(own):
    return at, (
      f"{method.path}'s CONTROL = {control!r} leaves the run config as the method's own: the control would "
      f"train the method itself and 'vs control' would compare nothing; make CONTROL in {method.path} set a "
      f"field of its block to the value that removes the method's effect (e.g. {example(method)})"
    )
  return None


def where(config: ConfigDict, arm: Arm) -> str:
  """How an error names `arm`: its field for an arm of `benchmark.arms`, else by its name and method
  (an arm that `benchmark.methods` selects by the method's module path)."""
  explicit = arm.name in config.benchmark.get("arms", {})
  return f"--config.benchmark.arms.{arm.name}" if explicit else f"arm {arm.name!r} (method {arm.method!r})"


def example(method: registry.Method) -> str:
  """A CONTROL entry's shape for `method`: a field of its block under config.hybrid, and a value."""
  return f"{{'{method.config_key or '<its block>'}.<field>': <value>}}"


def one_line(e: Exception) -> str:
  """`e`'s message on one line (`config.validate` lists its errors one a line)."""
  return str(e).replace("\n  ", " ")


def apply(arm: Arm, c: ConfigDict) -> None:
  """Makes `c` (a run's experiment config) the arm's: its mode, its method and the method's block,
  its overrides, and the method's control overrides for a control arm (a CONTROL key that names no
  field under `config.hybrid` is a ValueError naming the method's module and the fix)."""
  c.mode = arm.mode
  if arm.mode == "hybrid":  # a baseline-mode arm's steps are the baseline loop's: it names no hybrid method
    c.hybrid.method = arm.method
    config_lib.with_method_block(c)
  c.update_from_flattened_dict(arm.overrides)
  if arm.control:  # dotted paths under `config.hybrid`
    method = registry.load_method(arm.method)
    control = dict(declared(method, "CONTROL") or {})
    try:
      c.hybrid.update_from_flattened_dict(control)
    except (KeyError, AttributeError, TypeError) as e:
      raise ValueError(
        f"{method.path}'s CONTROL = {control!r} sets a field config.hybrid does not have "
        f"({e.args[0] if e.args else e}): CONTROL's keys are dotted fields under config.hybrid, without "
        f"'hybrid.' (e.g. {example(method)}); fix CONTROL in {method.path}"
      ) from None


def step_kind(arm: Arm | None, row: dict[str, Any]) -> str:
  """A step's cost class from its trace record (`branch`, `measured`, the method's own fields): the
  method's `step_kind`, or its transition's name. Every step of a baseline-mode arm is a real step."""
  if arm is None or arm.mode == "baseline":
    return REAL_STEP
  kind = declared(registry.load_method(arm.method), "step_kind")
  return kind(row) if kind is not None else BRANCH_NAMES[int(row["branch"])]
