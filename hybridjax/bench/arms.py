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
from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax import registry

REAL_STEP = "real_step"  # the one step kind of an arm that trains in baseline mode


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str
  method: str
  mode: str = "hybrid"
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # flattened: 'hybrid.jump.forecast'
  control: bool = False
  control_of: str = ""


def arms(config: ml_collections.ConfigDict) -> dict[str, Arm]:
  """Every arm the config defines, by name: the entries of `benchmark.arms`, and for each method
  that `benchmark.methods` names by its module path (or built-in name) rather than by an arm, the
  arm named by the method's `NAME` and, where it declares a `CONTROL`, its control arm
  `<NAME>_control`."""
  out = {}
  for name, a in config.benchmark.get("arms", {}).items():
    a = a.to_dict() if hasattr(a, "to_dict") else dict(a)
    overrides = config_lib.flatten(a.get("overrides") or {})
    out[name] = Arm(
      name=name,
      method=str(a.get("method", "")),
      mode=str(a.get("mode", "hybrid")),
      overrides=overrides,
      control=bool(a.get("control", False)),
      control_of=str(a.get("control_of", "")),
    )
  for entry, method in _methods_named(config, out).items():
    out.setdefault(method.name, Arm(name=method.name, method=entry))
    if method.control_arm:
      control = f"{method.name}_control"
      out.setdefault(control, Arm(name=control, method=entry, control=True, control_of=method.name))
  return out


def _methods_named(config: ml_collections.ConfigDict, defined: dict[str, Arm]) -> dict[str, registry.Method]:
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


def selected(config: ml_collections.ConfigDict) -> list[str]:
  """The arms `benchmark.methods` names, in its order: an arm's name, or a method's module path,
  which selects the method's arm and its control arm (`arms`). Errors name the field and the arms."""
  explicit = {name: arm for name, arm in arms(config).items() if name in config.benchmark.get("arms", {})}
  defined = arms(config)
  chosen = []
  for entry in names(config.benchmark.methods):
    if entry in explicit:
      chosen.append(entry)
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
    if method.control_arm:
      chosen.append(f"{method.name}_control")
  bad = [n for n in chosen if n not in defined]
  if bad or len(set(chosen)) != len(chosen):
    raise ValueError(
      f"--config.benchmark.methods={config.benchmark.methods!r}: give distinct names from "
      f"{','.join(defined)} (the arms of benchmark.arms), a built-in method's name or the module path "
      "of a method of yours (e.g. my_pkg.my_method: its arm and its control arm), or '' for the anchors only"
    )
  return chosen


def check(config: ml_collections.ConfigDict) -> list[str]:
  """The arms' problems: a method that does not load, an unknown mode, a control without one."""
  errors = []
  for arm in arms(config).values():
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
    if arm.control and not method.control_arm:
      errors.append(f"benchmark.arms.{arm.name}.control: method {arm.method!r} declares no CONTROL arm")
    if arm.control_of and arm.control_of not in arms(config):
      errors.append(f"benchmark.arms.{arm.name}.control_of names no arm: {arm.control_of!r}")
  return errors


def apply(arm: Arm, c: ml_collections.ConfigDict) -> None:
  """Makes `c` (a run's experiment config) the arm's: its mode, its method and the method's block,
  its overrides, and the method's control overrides for a control arm."""
  c.mode = arm.mode
  if arm.mode == "hybrid":  # a baseline-mode arm's steps are the baseline loop's: it names no hybrid method
    c.hybrid.method = arm.method
    config_lib.with_method_block(c)
  if arm.overrides:
    c.update_from_flattened_dict(arm.overrides)
  if arm.control:  # dotted paths under `config.hybrid`
    c.hybrid.update_from_flattened_dict(dict(registry.load_method(arm.method).control_arm))


def step_kind(arm: Arm | None, row: dict[str, Any]) -> str:
  """A step's cost class from its trace record (`branch`, `measured`, the method's own fields): the
  method's `step_kind`, or its transition's name. Every step of a baseline-mode arm is a real step."""
  if arm is None or arm.mode == "baseline":
    return REAL_STEP
  method = registry.load_method(arm.method)
  kind = method.step_kind
  if kind is not None:
    return kind(row)
  return ("full_step", "predict_step", "correct_step")[int(row["branch"])]
