"""The trainer's refusals of settings that `config.validate` cannot judge alone: what a run would
silently ignore or silently change.

`config.validate` checks each field and the relations within one config. These checks need more:
a method's module (a misspelt hook name), the reference values a setting is compared against (a
hybrid or optimizer setting with no effect in this run), or the checkpoint a run resumes (a resume with another
`trainer.steps`). Only the trainer's path (`loop.train.train`, the experiment programs) calls them.
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
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


# --- a block misnamed from Python ----------------------------------------------------------------

# How close (difflib's ratio) a top-level block's name must be to a declared block's for the two to
# be compared field by field: `optimizer` for `optim` is 0.71.
NEAR_BLOCK_CUTOFF = 0.5


def misnamed_block_errors(config: ml_collections.ConfigDict, method: registry.Method | None = None) -> list[str]:
  """A line for each top-level block of `config` that no one reads but that looks like a declared
  block set under another name (`config.update({"optimizer": {"learning_rate": ...}})` for `optim`):
  its name near a declared block's and one of its fields one of that block's. `config.validate`
  leaves a block of its own to the task that owns it (`config.unknown_field_errors`), so such a
  block would otherwise train on the defaults it meant to change, without a word."""
  known = config_lib.declared_fields(method)
  errors = []
  for top in config:
    block = config[top]
    if top in config_lib.DECLARED_BLOCKS + config_lib.OTHER_BLOCKS or not hasattr(block, "items"):
      continue
    fields = sorted(config_lib.flatten(block))
    for near in difflib.get_close_matches(top, config_lib.DECLARED_BLOCKS, n=3, cutoff=NEAR_BLOCK_CUTOFF):
      shared = [f for f in fields if f"{near}.{f}" in known]
      if shared:
        errors.append(
          f"--config.{top}.{shared[0]} is in a block no one reads: did you mean --config.{near}.{shared[0]}? "
          f"`{top}` looks like `{near}` set under another name (it shares {', '.join(shared)}), and the run "
          f"would train on {near}'s defaults; rename the block to `{near}`, or give a block of your own a "
          "name no declared block is near"
        )
        break
  return errors


def check_block_names(config: ml_collections.ConfigDict, method: registry.Method | None = None) -> None:
  """Refuses `config` when `misnamed_block_errors` finds a declared block set under another name."""
  _raise(misnamed_block_errors(config, method))


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

  _raise(misspelt_hook_errors(importlib.import_module(method.path), method.name) + builtin_name_errors(method))


def builtin_name_errors(method: registry.Method) -> list[str]:
  """The errors of a user's method whose NAME or CONFIG_KEY is a built-in method's: the run's
  record and summary would name the built-in method while the user's trained, and a shared block
  would mix the two methods' fields."""
  errors = []
  if method.name in registry.BUILTIN_METHODS:
    errors.append(
      f"--config.hybrid.method={method.path!r} declares NAME = {method.name!r}, the built-in method's name: its "
      f"runs' records and summaries would say {method.name!r} trained; give NAME a name of its own in {method.path}"
    )
  builtin_keys = {registry.load_method(name).config_key: name for name in registry.BUILTIN_METHODS}
  builtin_keys.pop(None, None)  # a method without a block shares none
  if method.config_key in builtin_keys:
    errors.append(
      f"--config.hybrid.method={method.path!r} declares CONFIG_KEY = {method.config_key!r}, the block of the "
      f"built-in method {builtin_keys[method.config_key]!r} (--config.hybrid.{method.config_key}.*): give "
      f"CONFIG_KEY a key of its own in {method.path}"
    )
  return errors


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


# --- optimizer settings with no effect --------------------------------------------------------------

# What each run reads of `config.optim` (and the named `trainer.*` fields): data that mirrors
# `hybridjax.optim`, kept true by tests/loop/test_settings_check.py, which changes each field and
# compares the optimizer's updates (or the learning rates) bit for bit.

# Every run, whatever its optimizer: the name (the run's record), and outer momentum's period
# (`loop.drivers.outer_settings`; its eta and mu only with a period, which `optimizer_setting_errors`
# checks).
RUN_READS = ("name", "outer_every", "outer_eta", "outer_mu")

# `optim.make_schedule` -> `optim.learning_rate`: the schedule drives every optimizer, a user's
# `train(tx=...)` included (`optim.with_learning_rate`). Only 'wsd' reads `decay_fraction`.
SCHEDULE_READS: dict[str, tuple[str, ...]] = {
  "cosine": ("schedule", "learning_rate", "warmup_steps", "decay_steps", "min_lr_ratio"),
  "wsd": ("schedule", "learning_rate", "warmup_steps", "decay_steps", "min_lr_ratio", "decay_fraction"),
}

_MUON_MOMENTUM = ("muon_momentum", "muon_momentum_warmup_steps", "muon_momentum_start")  # `optim.muon_momentum`
TIED_HEAD_FIELDS = ("tied_lr_ratio", "tied_b1", "tied_b2", "tied_eps")  # `optim.tied_head_settings`

# `optim.name` -> the optimizer fields `optim.make_optimizer` reads for it (every built-in: the
# clipping `grad_clip` it chains in front).
OPTIMIZER_READS: dict[str, tuple[str, ...]] = {
  # `adamw()` (b1, b2, eps, weight_decay) and, when either is not 1.0, `_scale_groups` (the ratios).
  "adamw": ("grad_clip", "b1", "b2", "eps", "weight_decay", "adamw_embed_lr_ratio", "adamw_head_lr_ratio"),
  # `optax.adam(b1, b2, eps)`: no weight decay; `_scale_groups` as for 'adamw'.
  "adam": ("grad_clip", "b1", "b2", "eps", "adamw_embed_lr_ratio", "adamw_head_lr_ratio"),
  # `optax.sgd(momentum=0.9)`: a fixed momentum, no betas, eps or weight decay.
  "sgd": ("grad_clip",),
  # `_muon` / `_muon_with_momentum` (muon_weight_decay, `muon_momentum`) on `muon_labels`' matrices,
  # `adamw()` scaled by adam_lr_ratio on the rest.
  "muon": ("grad_clip", "b1", "b2", "eps", "weight_decay", "adam_lr_ratio", "muon_weight_decay", *_MUON_MOMENTUM),
  # `_muon_groups`: Muon with no weight decay, Adam groups with their own ratios and betas, a tied
  # head at `tied_head_settings` (which of head_lr_ratio and the tied fields a GPT-2 model reads:
  # `UNTIED_HEAD_READS`, `TIED_HEAD_READS`).
  "muon_groups": (
    "grad_clip",
    "embed_lr_ratio",
    "head_lr_ratio",
    "scalar_lr_ratio",
    "groups_b1",
    "groups_b2",
    "groups_eps",
    "groups_lr_scale",
    *TIED_HEAD_FIELDS,
    *_MUON_MOMENTUM,
  ),
}

# `optim.resolve_optimizer`: an optimizer of the user's (`train(tx=...)`, any other `optim.name`) is
# used as given; it reads none of the fields above, only the schedule's (`SCHEDULE_READS`).
USER_OPTIMIZER_READS: tuple[str, ...] = ()

# The fields that configure an optimizer: those that only some optimizers read (a user's reads none).
OPTIMIZER_FIELDS = tuple(dict.fromkeys(f for reads in OPTIMIZER_READS.values() for f in reads))

# On a GPT-2 model, by `model.untied_head`: the head group holds only an untied head (`lm_head`). A
# token embedding tied to the head is in the embed group under 'adamw' and 'adam'
# (`optim.adamw_group_labels`), and takes `optim.tied_head_settings` under 'muon_groups'
# (`optim.muon_group_labels`; they fall back to the head group's only in a block without the tied
# fields). So some head fields are read only with an untied head, others only with a tied one.
UNTIED_HEAD_READS: dict[str, tuple[str, ...]] = {
  "adamw": ("adamw_head_lr_ratio",),
  "adam": ("adamw_head_lr_ratio",),
  "muon_groups": ("head_lr_ratio",),
}
TIED_HEAD_READS: dict[str, tuple[str, ...]] = {"muon_groups": TIED_HEAD_FIELDS}

# What each optimizer is, for the refusals (`optimizer_setting_errors`).
OPTIMIZER_SUMMARY = {
  "adamw": "AdamW: b1, b2, eps, weight_decay",
  "adam": "Adam: b1, b2, eps, and no weight decay",
  "sgd": "SGD with a fixed momentum of 0.9: no betas, eps or weight decay",
  "muon": "Muon (muon_weight_decay) on the hidden matrices, AdamW (b1, b2, eps, weight_decay) at adam_lr_ratio on "
  "the rest",
  "muon_groups": "Muon with no weight decay on the hidden matrices, and Adam with no weight decay on the embeddings, "
  "the head and the scalars, each at its own *_lr_ratio, with groups_b1, groups_b2, groups_eps",
}

# (optimizer, field it does not read) -> what sets that under this optimizer.
COUNTERPARTS: dict[tuple[str, str], str] = {
  **{("muon_groups", f): f"--config.optim.groups_{f}" for f in ("b1", "b2", "eps")},
  ("muon_groups", "adam_lr_ratio"): (
    "--config.optim.embed_lr_ratio, head_lr_ratio and scalar_lr_ratio (--config.optim.groups_lr_scale scales them all)"
  ),
  ("muon_groups", "adamw_embed_lr_ratio"): "--config.optim.embed_lr_ratio",
  ("muon_groups", "adamw_head_lr_ratio"): "--config.optim.head_lr_ratio",
  **{(o, f"groups_{f}"): f"--config.optim.{f}" for o in ("adamw", "adam", "muon") for f in ("b1", "b2", "eps")},
  **{
    ("muon", f): "--config.optim.adam_lr_ratio"
    for f in ("embed_lr_ratio", "head_lr_ratio", "scalar_lr_ratio", "groups_lr_scale")
  },
  **{(o, "embed_lr_ratio"): "--config.optim.adamw_embed_lr_ratio" for o in ("adamw", "adam")},
  **{(o, "head_lr_ratio"): "--config.optim.adamw_head_lr_ratio" for o in ("adamw", "adam")},
  ("adamw", "muon_weight_decay"): "--config.optim.weight_decay",
}

# A user's optimizer (`train(tx=...)`): where each field's setting goes instead.
_USER_OPTIMIZER_HINTS = {
  "grad_clip": "optax.chain(optax.clip_by_global_norm({grad_clip}), ...)",
  "weight_decay": "optax.adamw(learning_rate, weight_decay={weight_decay})",
  "b1": "optax.adamw(learning_rate, b1={b1})",
  "b2": "optax.adamw(learning_rate, b2={b2})",
  "eps": "optax.adamw(learning_rate, eps={eps})",
}


def optimizer_reads(name: str, untied_head: bool | None = None) -> tuple[str, ...]:
  """The optimizer fields (`OPTIMIZER_FIELDS`) that optimizer `name` reads: its `OPTIMIZER_READS`
  row (a name that is not a built-in one: a user's optimizer, `USER_OPTIMIZER_READS`). On a GPT-2
  model (`untied_head` known), without the head fields its head does not read (`UNTIED_HEAD_READS`,
  `TIED_HEAD_READS`)."""
  reads = OPTIMIZER_READS.get(name, USER_OPTIMIZER_READS)
  if untied_head is not None:
    unread = set((TIED_HEAD_READS if untied_head else UNTIED_HEAD_READS).get(name, ()))
    reads = tuple(f for f in reads if f not in unread)
  return reads


def _readers(field: str) -> str:
  """The built-in optimizers that read `field`, as words: "'adamw', 'adam' and 'muon'"."""
  names = [repr(n) for n, reads in OPTIMIZER_READS.items() if field in reads]
  return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def optimizer_setting_errors(
  config: ml_collections.ConfigDict, references: Sequence[ml_collections.ConfigDict]
) -> list[str]:
  """A line for each `config.optim` (or `trainer.averaging_beta`) field that is set (its value is
  none of the `references`' values of it) where the run will not read it, naming the field and the
  fix:

  * a field of another optimizer than `optim.name` (`optimizer_reads`); under a user's optimizer
    (`train(tx=...)`, any name that is not a built-in one) every optimizer field, since that
    optimizer is used as given;
  * on a GPT-2 model, the head fields its head does not read (`UNTIED_HEAD_READS`, `TIED_HEAD_READS`);
  * `optim.decay_fraction` with a schedule other than 'wsd'; `optim.muon_momentum_start` with no
    momentum warm-up; `optim.outer_eta` and `outer_mu` with outer momentum off; and
    `trainer.averaging_beta` with averaging off.
  """
  flat = {
    **{f"optim.{k}": v for k, v in _json_flat(config.optim).items()},
    **{f"trainer.{k}": v for k, v in _json_flat(config.get("trainer") or {}).items()},
  }
  ref_flats = [_json_flat(r) for r in references]
  default = ref_flats[0] if ref_flats else {}

  def is_set(field: str) -> bool:
    return field in flat and all(r.get(field, "<absent>") != flat[field] for r in ref_flats)

  def listed(fields: list[str]) -> str:
    return ", ".join(
      f"--config.{f}={flat[f]!r}" + (f" (default {default[f]!r})" if f in default else "") for f in fields
    )

  def them(fields: list[str]) -> tuple[str, str]:
    return ("has", "it") if len(fields) == 1 else ("have", "them")

  o = config.optim
  name = o.name
  untied = None
  if "model" in config and "untied_head" in config.model:
    untied = bool(config.model.untied_head)
  reads = set(optimizer_reads(name, untied))
  errors = []
  reported = set()
  if name not in OPTIMIZER_READS:  # a user's optimizer: used as given
    unread = [f"optim.{f}" for f in OPTIMIZER_FIELDS if is_set(f"optim.{f}")]
    if unread:
      verb, obj = them(unread)
      values = {f.split(".")[1]: flat[f] for f in unread}
      hints = [_USER_OPTIMIZER_HINTS[f].format(**values) for f in values if f in _USER_OPTIMIZER_HINTS]
      build = f" (e.g. {'; '.join(hints)})" if hints else ""
      errors.append(
        f"{listed(unread)} {verb} no effect: --config.optim.name={name!r} names your own optimizer (train(tx=...)), "
        "which is used as given (optim.resolve_optimizer): of config.optim it reads only the schedule's fields "
        f"(learning_rate, schedule, warmup_steps, decay_steps, min_lr_ratio, decay_fraction) and outer momentum's. "
        f"Build {obj} into the optimizer you pass{build}, and leave {obj} at the default"
      )
      reported |= set(unread)
  else:
    for f in OPTIMIZER_FIELDS:
      field = f"optim.{f}"
      if f in reads or not is_set(field):
        continue
      reported.add(field)
      if f in OPTIMIZER_READS[name]:  # a head field the model's head does not read
        if untied:
          why = (
            "--config.model.untied_head=True gives the model a head of its own (lm_head, in the head group at "
            "--config.optim.head_lr_ratio), so no parameter is tied to the head (optim.muon_group_labels). Set "
            "--config.model.untied_head=False to train with it, or leave it at the default"
          )
        elif name == "muon_groups":
          why = (
            "--config.model.untied_head=False ties the head to the token embedding, which 'muon_groups' trains "
            "with --config.optim.tied_lr_ratio, tied_b1, tied_b2 and tied_eps (optim.tied_head_settings): no "
            "parameter is in the head group. Set --config.optim.tied_lr_ratio instead, or "
            "--config.model.untied_head=True for a head of its own, or leave it at the default"
          )
        else:
          why = (
            f"--config.model.untied_head=False ties the head to the token embedding, which {name!r} trains at "
            "--config.optim.adamw_embed_lr_ratio (optim.adamw_group_labels): no parameter is in the head group. "
            "Set --config.optim.adamw_embed_lr_ratio instead, or --config.model.untied_head=True for a head of its "
            "own, or leave it at the default"
          )
        errors.append(f"{listed([field])} has no effect: {why}")
        continue
      counterpart = COUNTERPARTS.get((name, f))
      if counterpart:
        fix = (
          f"{name!r} reads {counterpart} instead: set {'those' if ' and ' in counterpart else 'that'}, or leave "
          f"--config.{field} at the default"
        )
      else:
        readers = _readers(f)
        fix = (
          f"Only {readers} {'reads' if ' and ' not in readers else 'read'} it: set --config.optim.name to "
          f"{'it' if ' and ' not in readers else 'one of them'} to train with it, or leave it at the default"
        )
      errors.append(
        f"{listed([field])} has no effect: --config.optim.name={name!r} does not read it ({OPTIMIZER_SUMMARY[name]}; "
        f"optim.make_optimizer). {fix}"
      )

  def unread_when(fields: list[str], why: str, fix: str) -> None:
    unread = [f for f in fields if f not in reported and is_set(f)]
    if unread:
      verb, obj = them(unread)
      errors.append(f"{listed(unread)} {verb} no effect: {why}. {fix.format(obj=obj)}, or leave {obj} at the default")

  schedule = o.get("schedule", "cosine")
  if "decay_fraction" not in SCHEDULE_READS.get(schedule, ("decay_fraction",)):
    unread_when(
      ["optim.decay_fraction"],
      f"it is the share of the 'wsd' schedule spent decaying, and --config.optim.schedule={schedule!r} decays from "
      "the end of the warm-up (optim.make_schedule)",
      "Set --config.optim.schedule=wsd to train with {obj}",
    )
  if "muon_momentum_start" in reads and not int(o.get("muon_momentum_warmup_steps", 0)):
    unread_when(
      ["optim.muon_momentum_start"],
      "it is where Muon's momentum warm-up starts, and --config.optim.muon_momentum_warmup_steps=0 keeps the "
      f"momentum at --config.optim.muon_momentum={optim_lib.final_muon_momentum(o)} throughout (optim.muon_momentum)",
      "Set --config.optim.muon_momentum_warmup_steps above 0 to warm up from {obj}",
    )
  if not int(o.get("outer_every", 0)):
    unread_when(
      ["optim.outer_eta", "optim.outer_mu"],
      "--config.optim.outer_every=0 turns outer momentum off (loop.drivers.outer_settings)",
      "Set --config.optim.outer_every above 0 (the real steps between outer steps) to train with {obj}",
    )
  averaging = (config.get("trainer") or {}).get("averaging", "none")
  if averaging != "ema":
    unread_when(
      ["trainer.averaging_beta"],
      f"--config.trainer.averaging={averaging!r} keeps no average of the params (loop.drivers.averaging_beta)",
      "Set --config.trainer.averaging=ema to train with {obj}",
    )
  return errors


def check_inert_settings(
  config: ml_collections.ConfigDict,
  method: registry.Method,
  references: Sequence[ml_collections.ConfigDict] | None = None,
  *,
  control: Mapping[str, Any] | None = None,
) -> None:
  """Refuses `config` when `inert_setting_errors` (hybrid settings) or `optimizer_setting_errors`
  (optimizer settings) finds a setting with no effect. `references`: default
  `reference_configs(config, method)`."""
  if references is None:
    references = reference_configs(config, method)
  _raise(
    inert_setting_errors(config, method, references, control=control) + optimizer_setting_errors(config, references)
  )


# --- a model setting the gpt2 task does not apply ------------------------------------------------------


def gpt2_task_errors(config: ml_collections.ConfigDict) -> list[str]:
  """Model settings the GPT-2 task (`tasks.gpt2`, the CLI's and the benchmark's) would record but not
  apply: `model.dropout` > 0, since its batches carry no `dropout_rng` and `models.gpt2.make_loss_fn`
  runs the forward pass deterministic without one."""
  dropout = float(config.get("model", {}).get("dropout", 0.0))
  if dropout > 0:
    return [
      f"--config.model.dropout={dropout} is set but not applied: the GPT-2 task's batches carry no dropout key "
      "(dropout_rng), so every forward pass is deterministic. Leave --config.model.dropout at 0, or train "
      "through hybridjax.train with batches that hold a 'dropout_rng' (models.gpt2.make_loss_fn)"
    ]
  return []


def check_gpt2_task(config: ml_collections.ConfigDict) -> None:
  """Refuses what `gpt2_task_errors` names."""
  _raise(gpt2_task_errors(config))


# --- a user's optimizer the schedule cannot drive -----------------------------------------------------

_FACTORY_FIX = (
  "Pass a factory learning_rate -> transformation instead, with any per-group ratios inside it: "
  "tx=lambda lr: optax.multi_transform({'a': optax.adam(lr), 'b': optax.adam(lr * 0.1)}, labels) "
  "(a frozen group: optax.set_to_zero())"
)


def _injected_learning_rates(state: Any) -> tuple[list[tuple[str, Any]], list[str]]:
  """The `inject_hyperparams` states of `state` holding a `learning_rate`: (path, node) of the
  outermost ones, which `optim.with_learning_rate` writes, and the paths of those nested inside one
  (a factory that returns an injected transformation), which it never writes."""
  outer, nested = [], []

  def walk(tree: Any, prefix: str, inside: bool) -> None:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=optim_lib._is_inject_state)
    for path, node in flat:
      if not optim_lib._is_inject_state(node):
        continue
      where = prefix + jax.tree_util.keystr(path)
      has_lr = "learning_rate" in node.hyperparams
      if has_lr:
        (nested.append(where) if inside else outer.append((where, node)))
      walk(node.inner_state, where + ".inner_state", inside or has_lr)

  walk(state, "state", False)
  return outer, nested


class _Mark:
  def __init__(self, index: int):
    self.index = index


def _initial_learning_rates(tx: Any, params: Any) -> list[float | None]:
  """The initial value of each outermost injected `learning_rate` of `tx.init(params)` (in the order of
  `_injected_learning_rates`; None where it is not a constant), read from the traced `tx.init`: a
  constant hyperparameter is a literal or a constant of its jaxpr. Nothing is computed or allocated."""
  closed, shape = jax.make_jaxpr(tx.init, return_shape=True)(params)
  count = [0]

  def mark(node: Any) -> Any:
    if optim_lib._is_inject_state(node):
      if "learning_rate" in node.hyperparams:
        m = _Mark(count[0])
        count[0] += 1
        return node._replace(hyperparams={**node.hyperparams, "learning_rate": m})
      return node._replace(inner_state=jax.tree.map(mark, node.inner_state, is_leaf=optim_lib._is_inject_state))
    return node

  leaves = jax.tree.leaves(jax.tree.map(mark, shape, is_leaf=optim_lib._is_inject_state))
  values: list[float | None] = [None] * count[0]
  outvars = closed.jaxpr.outvars
  if len(leaves) != len(outvars):
    return values
  consts = dict(zip(closed.jaxpr.constvars, closed.consts, strict=True))
  for leaf, var in zip(leaves, outvars, strict=True):
    if isinstance(leaf, _Mark):
      if isinstance(var, jax.extend.core.Literal):
        values[leaf.index] = float(var.val)
      elif var in consts and jnp.ndim(consts[var]) == 0:
        values[leaf.index] = float(consts[var])
  return values


def _learning_rate_reaches_updates(tx: Any, params: Any) -> bool:
  """Whether the learning rate `optim.with_learning_rate` writes into `tx`'s state reaches the
  updates of `tx.update`, as the train step calls it: a backward walk over the traced update's
  equations from its updates (an equation with a needed output needs all its inputs, sub-programs
  included), so it may say yes for a learning rate that has no effect, never no for one that has.
  Only traced (`jax.make_jaxpr` on the shapes): nothing is computed."""
  state = jax.eval_shape(tx.init, params)
  lr = jax.ShapeDtypeStruct((), jnp.float32)

  def updates(lr, grads, state, params):
    return tx.update(grads, optim_lib.with_learning_rate(state, lr), params)[0]

  jaxpr = jax.make_jaxpr(updates)(lr, params, state, params).jaxpr
  needed = {v for v in jaxpr.outvars if not isinstance(v, jax.extend.core.Literal)}
  for eqn in reversed(jaxpr.eqns):
    if any(v in needed for v in eqn.outvars if not isinstance(v, jax.extend.core.DropVar)):
      needed.update(v for v in eqn.invars if not isinstance(v, jax.extend.core.Literal))
  return jaxpr.invars[0] in needed


def user_optimizer_errors(tx: Any, params: Any, optim: ml_collections.ConfigDict) -> list[str]:
  """What would keep the config's schedule from driving a user's optimizer (`train(tx=...)`,
  resolved: `optim.resolve_optimizer`), each a line naming the fix; empty when it drives it.

  `optim.with_learning_rate` writes the scheduled learning rate into every injected `learning_rate`
  before each update. That is silently defeated by
  * a schedule-valued injected learning rate (`inject_hyperparams(optax.adam)(learning_rate=
    optax.constant_schedule(0.0))`): optax recomputes it from its own count at every update;
  * a transformation whose updates do not read the injected learning rate (a factory that ignores
    its argument, `lambda learning_rate: optax.adam(1e-3)`);
  * injected learning rates that differ (per-group rates in a `multi_transform`): every one is
    overwritten with the same rate, and the ratios are lost; and an injected learning rate inside
    another's (a factory that returns an injected transformation), which it never writes: it keeps
    its initial value.

  `params`: the params or their `jax.ShapeDtypeStruct`s. Only traced: nothing is computed.
  """
  sched = (
    f"the config's schedule (--config.optim.schedule={optim.get('schedule', 'cosine')!r}, peak "
    f"--config.optim.learning_rate={optim.learning_rate})"
  )
  head = f"the optimizer {optim.name!r} given to train(tx=...)"
  state = jax.eval_shape(tx.init, params)
  injected, nested = _injected_learning_rates(state)
  errors = []
  scheduled = [where for where, node in injected if "learning_rate" in getattr(node, "hyperparams_states", {})]
  if scheduled:
    errors.append(
      f"{head} has a schedule as its injected learning rate ({', '.join(scheduled)}: "
      "optax.inject_hyperparams(...)(learning_rate=<a schedule>)). optax recomputes it from its own step count at "
      f"every update, overwriting the rate {sched} writes, so the run would record one schedule and train on "
      "another. Give a number, the config's schedule drives it: optax.inject_hyperparams(optax.adam)"
      "(learning_rate=0.0), or a factory tx=lambda lr: optax.adam(lr)"
    )
  if nested:
    errors.append(
      f"{head} holds an injected learning rate inside another ({', '.join(nested)}): a factory that returns an "
      f"optax.inject_hyperparams(...) transformation. {sched.capitalize()} is written into the outer one only "
      "(optim.with_learning_rate), so the inner one silently keeps its initial value whatever the factory "
      "computes from its argument. Return a plain transformation from the factory: tx=lambda lr: optax.adam(lr), "
      "with any per-group ratios inside it (optax.multi_transform({'a': optax.adam(lr), 'b': optax.adam(lr * 0.1)}, "
      "labels))"
    )
  if len(injected) > 1:
    values = _initial_learning_rates(tx, params)
    if None in values or len(set(values)) > 1:
      shown = ", ".join(
        f"{where}={'<not a constant>' if v is None else f'{v:g}'}"
        for (where, _), v in zip(injected, values, strict=True)
      )
      errors.append(
        f"{head} has {len(injected)} injected learning rates that differ ({shown}). {sched.capitalize()} writes "
        "the same learning rate into every one of them (optim.with_learning_rate), so their ratios (a group "
        f"frozen at 0, a slower group) would be silently lost. {_FACTORY_FIX}"
      )
  if not scheduled and not nested and not _learning_rate_reaches_updates(tx, params):
    errors.append(
      f"{head} does not use the learning rate {sched} writes into it (optim.with_learning_rate): its updates do "
      "not depend on it, e.g. a factory that ignores its argument (tx=lambda learning_rate: optax.adam(1e-3)). "
      "The run would record the schedule and train on a rate of its own. Build the optimizer from the factory's "
      "argument: tx=lambda learning_rate: optax.adam(learning_rate)"
    )
  return errors


def check_user_optimizer(tx: Any, params: Any, optim: ml_collections.ConfigDict) -> None:
  """Refuses a user's optimizer that the config's schedule cannot drive (`user_optimizer_errors`)."""
  errors = user_optimizer_errors(tx, params, optim) + optim_lib.overwritten_learning_rate_errors(tx, params, optim)
  if errors:
    raise ValueError("\n  ".join(errors))


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
