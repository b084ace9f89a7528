"""The trainer's refusals of settings that `config.validate` cannot judge alone: what a run would
silently ignore or silently change.

`config.validate` checks each field and the relations within one config. These checks need more:
a method's module (a misspelt hook name), the reference values a setting is compared against (a
hybrid setting with no effect in this run), or the checkpoint a run resumes (a resume with another
`trainer.steps`). Only the trainer's path (`loop.train.train`, the experiment programs) calls them.
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax import optim as optim_lib
from hybridjax import registry

# The generic controller's settings (`hybrid.context.ControllerSettings`) -> their config fields
# under `config.hybrid`; what a method's `control()` may override.
CONTROL_FIELDS = {
  "enable_predict": "enable_predict",
  "warmup_steps": "warmup_steps",
  "full_steps": "full_steps",
  "max_predict_steps": "max_predict_steps",
  "confidence_threshold": "confidence_threshold",
  "correct_steps": "correct_steps",
  "correction_interval": "correction_interval",
  "grad_explosion_factor": "health.grad_explosion_factor",
  "loss_spike_sigma": "health.loss_spike_sigma",
  "max_prediction_failures": "health.max_prediction_failures",
  "cooldown_steps": "health.cooldown_steps",
}


def _raise(errors: list[str]) -> None:
  if errors:
    raise ValueError("invalid config:\n  " + "\n  ".join(errors))


# --- a method module's names ---------------------------------------------------------------------

# The module-level names the method interface reads (`registry.method_record`), and the earlier
# names it refuses.
INTERFACE_NAMES = frozenset(registry._ATTRIBUTES.values()) | frozenset(registry.REQUIRED) | {"CONFIG"}
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
    near = difflib.get_close_matches(name.lower(), list(lower), n=1, cutoff=NEAR_NAME_CUTOFF)
    if near:
      meant = lower[near[0]]
      errors.append(
        f"--config.hybrid.method={method_name!r} ({module.__name__}) defines {name}, which the method interface "
        f"does not read: did you mean {meant}? As spelt, {meant} stays at its default. Rename it to {meant}, or "
        f"to _{name} if it is a helper of your own (docs/methods.md lists the interface)"
      )
  return errors


def check_method_names(method: registry.Method) -> None:
  """Refuses a user's method whose module defines a near-miss of an interface name
  (`misspelt_hook_errors`). The built-in methods are the test suite's to check."""
  if method.path in registry.BUILTIN_METHODS.values():
    return
  import importlib

  _raise(misspelt_hook_errors(importlib.import_module(method.path), method.name))


# --- hybrid settings with no effect ----------------------------------------------------------------


def _json_flat(config: Any) -> dict[str, Any]:
  """A config's (or block's) leaves by dotted name, as its JSON record holds them (tuples as lists)."""
  if isinstance(config, ml_collections.ConfigDict):
    config = json.loads(config.to_json())
  return config_lib.flatten(config)


def reference_configs(
  config: ml_collections.ConfigDict, method: registry.Method | None = None
) -> list[ml_collections.ConfigDict]:
  """The default reference of `inert_setting_errors` for `config`:
  `hybridjax.default_config(mode, method)` (the method's block at its defaults in hybrid mode).
  `method`: the config's, resolved already (default: by its name)."""
  reference = config_lib.default_config(mode=config.mode)
  if config.mode == "hybrid":
    reference.hybrid.method = config_lib.method_name(config)
    config_lib.with_method_block(reference, method)
  return [reference]


def inert_setting_errors(
  config: ml_collections.ConfigDict,
  method: registry.Method,
  references: Sequence[ml_collections.ConfigDict],
  *,
  control: Mapping[str, Any] | None = None,
) -> list[str]:
  """A line for each field of `config.hybrid` that is set (its value is none of the `references`'
  values of it) where the run will not read it, naming the field and the fix:

  * baseline mode: every hybrid field (the baseline reads none; `hybrid.method` is `validate`'s);
  * hybrid mode: the blocks of the built-in methods the run does not train;
  * hybrid mode: the controller fields that `method`'s `control()` sets (`control`: its overrides,
    {controller setting: value}; `drivers.make_context` discards the config's value), unless the
    config already holds the value the method sets.

  `references` are the configs whose values count as "not set": `reference_configs` (the library's
  defaults), or an experiment's presets, which tune the hybrid block for a hybrid run.
  """
  flat = _json_flat(config.hybrid)
  ref_flats = [_json_flat(r.hybrid) for r in references if "hybrid" in r]
  default = ref_flats[0] if ref_flats else {}

  def is_set(field: str) -> bool:
    return all(r.get(field, "<absent>") != flat[field] for r in ref_flats)

  def listed(fields: list[str]) -> str:
    return ", ".join(
      f"--config.hybrid.{f}={flat[f]!r}" + (f" (default {default[f]!r})" if f in default else "") for f in fields
    )

  def them(fields: list[str]) -> tuple[str, str]:
    return ("has", "it") if len(fields) == 1 else ("have", "them")

  errors = []
  if config.mode == "baseline":
    unread = [f for f in sorted(flat) if f != "method" and is_set(f)]
    if unread:
      verb, obj = them(unread)
      errors.append(
        f"{listed(unread)} {verb} no effect: --config.mode='baseline' trains the plain baseline, which reads no "
        f"hybrid setting. Set --config.mode=hybrid to train with {obj}, or leave {obj} at the default "
        "(hybridjax.default_config())"
      )
    return errors
  name = config_lib.method_name(config)
  for other in registry.BUILTIN_METHODS:
    key = registry.load_method(other).config_key
    if not key or key == method.config_key:
      continue
    unread = [f for f in sorted(flat) if f.startswith(key + ".") and is_set(f)]
    if unread:
      verb, obj = them(unread)
      errors.append(
        f"{listed(unread)} {verb} no effect: the block configures method {other!r}, but this run trains {name!r} "
        f"(--config.hybrid.method). Set --config.hybrid.method={other} to train that method, or leave {obj} at the "
        "default"
      )
  for setting, forced in sorted((control or {}).items()):
    field = CONTROL_FIELDS.get(setting)
    if field is None or field not in flat or flat[field] == forced or not is_set(field):
      continue
    errors.append(
      f"{listed([field])} has no effect: method {name!r} sets it to {forced!r} (its control(), "
      "docs/methods.md), whatever the config says. Leave it at the default, or train a method that reads it"
    )
  return errors


def check_inert_settings(
  config: ml_collections.ConfigDict,
  method: registry.Method,
  references: Sequence[ml_collections.ConfigDict] | None = None,
  *,
  control: Mapping[str, Any] | None = None,
) -> None:
  """Refuses `config` when `inert_setting_errors` finds a setting with no effect. `references`:
  default `reference_configs(config, method)`."""
  if references is None:
    references = reference_configs(config, method)
  _raise(inert_setting_errors(config, method, references, control=control))


# --- resuming with another trainer.steps -----------------------------------------------------------


def steps_dependence(config: ml_collections.ConfigDict) -> list[str]:
  """What of `config`'s training changes with `trainer.steps`, besides where it stops; empty when
  nothing does (then a run may be resumed with another `trainer.steps`):

  * the learning-rate schedule, when it decays over the run (`optim.decay_steps=0`) to a floor below
    the peak (`optim.min_lr_ratio < 1`); a schedule with its own `decay_steps`, or a constant one
    (after its warm-up, which `optim.warmup_steps` fixes), does not depend on it;
  * a hybrid run's method, whose steps receive the run's length (`HybridContext.total_steps`: the
    velocity predictor's progress feature, the jump's window; a user's method may read it).

  Muon's momentum warm-up and outer momentum count optimizer updates (`optim.*` fields, compared on
  resume like every other field), not the run's length."""
  o = config.optim
  found = []
  if not int(o.get("decay_steps", 0)) and float(o.get("min_lr_ratio", 0.0)) != 1.0:
    found.append(
      f"the learning-rate schedule ({o.get('schedule', 'cosine')} decay over --config.trainer.steps, since "
      "--config.optim.decay_steps=0)"
    )
  if config.get("mode") == "hybrid":
    found.append(
      f"method {config_lib.method_name(config)!r}, whose steps read the run's length (HybridContext.total_steps)"
    )
  return found


def _lr(optim: Any, total_steps: int, step: int) -> float:
  return float(optim_lib.learning_rate(optim_lib.make_schedule(optim, total_steps), step))


def steps_change_error(
  config: ml_collections.ConfigDict, saved_steps: int, step: int, workdir: str, *, finished: bool = False
) -> str | None:
  """The refusal of resuming a run of `saved_steps` (its checkpoint at `step`) with `config`'s
  `trainer.steps`, or None when the change is safe (the same value, or nothing depends on it,
  `steps_dependence`) or explicitly allowed (`resume='force'`). `finished`: the run had finished."""
  steps = int(config.trainer.steps)
  if steps == saved_steps:
    return None
  if step > steps:  # even with resume='force': there is no step left to train
    return (
      f"--workdir {workdir} holds a run of --config.trainer.steps={saved_steps} whose checkpoint is at step {step}, "
      f"past --config.trainer.steps={steps}: there is nothing to train. Use --config.trainer.steps={saved_steps} "
      "to resume it, or a new --workdir"
    )
  depends = steps_dependence(config)
  if not depends or config.resume == "force":
    return None
  if depends[0].startswith("the learning-rate schedule"):
    depends[0] += (
      f": the learning rate at step {step} would be {_lr(config.optim, steps, step):.4g} instead of "
      f"{_lr(config.optim, saved_steps, step):.4g}"
    )
  state = "finished its" if finished else f"stopped at step {step} of its"
  return (
    f"--workdir {workdir} holds a run that {state} {saved_steps} steps (--config.trainer.steps={saved_steps}); "
    f"this config asks for --config.trainer.steps={steps}. Resuming it would change, mid-run, "
    + "; and ".join(depends)
    + f". The run would then look like a clean {steps}-step run. Use --config.trainer.steps={saved_steps} to "
    f"resume it, a new --workdir to train {steps} steps from the start, or --config.resume=force to continue "
    f"with the schedule rebuilt for {steps} steps (recorded as steps_changes in the checkpoints and the summary)"
  )


def finished_message(config: ml_collections.ConfigDict, workdir: str, finished_steps: int) -> str:
  """What `train` prints for a run that has already finished its `finished_steps`: nothing to do,
  and how to train longer without silently changing its schedule."""
  steps = int(config.trainer.steps)
  asked = f" (--config.trainer.steps={steps} asks for no more)" if steps < finished_steps else ""
  if steps_dependence(config):
    longer = (
      "To train longer, use a new --workdir with a larger --config.trainer.steps: its schedule depends on "
      "the run's length, so continuing this run would change it mid-run"
    )
  else:
    longer = "Its schedule does not depend on the run's length: a larger --config.trainer.steps continues it"
  return f"{workdir} already finished its {finished_steps} steps{asked}; nothing to do. {longer}."
