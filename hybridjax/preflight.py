"""The pre-flight of a run: every check of a whole config, before anything is compiled or written.

`validate` checks each declared field (`schema.Field.check`: the top level's and every block's of
`config.BLOCKS`, a method's block, the GPT-2 task's model and data blocks) and the relations within
one config; `unknown_field_errors` and `misnamed_block_errors` name a key or block no one declares
(with the nearest declared one); `optimizer_setting_errors` and `inert_setting_errors` name a field
that is set where the run would not read it, generically from the declarations (`schema.Field.unread`,
`roles`; an optimizer's declared fields, a method's block, the controller settings a method sets).
`loop.train.train` and the experiment programs call them.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax import data as data_lib
from hybridjax import identity, registry, schema, sharding
from hybridjax import optim as optim_lib
from hybridjax.models import gpt2

# The blocks of an experiment config whose every field is declared: `config.BLOCKS` and the GPT-2
# task's model and data blocks (`tasks.gpt2`), checked when a config holds them. Any other block (a
# task's, e.g. `mlp`) is its owner's to check.
DECLARED: dict[str, tuple[schema.Field, ...]] = {
  **config_lib.BLOCKS,
  "model": gpt2.FIELDS,
  "data": data_lib.DATA_FIELDS,
}


def field_errors(config: ml_collections.ConfigDict, blocks: tuple[str, ...] | None = None) -> list[str]:
  """A line for each declared field of `config` (under `blocks`, default all) whose check refuses its
  value, or that is missing from a block that is present."""
  chosen = lambda name: name in config and (blocks is None or name in blocks)
  errors = schema.errors("", [f for f in config_lib.TOP_FIELDS if chosen(f.name)], config)
  for block in filter(chosen, DECLARED):
    errors += schema.errors(block, DECLARED[block], config_lib.flatten(config[block]))
  return errors


def _mode_errors(config: ml_collections.ConfigDict, blocks: tuple[str, ...] | None) -> Iterator[str]:
  """A method named in baseline mode; a hybrid run without its block."""
  method_set = (config.get("hybrid") or {}).get("method")
  if (blocks is None or "hybrid" in blocks) and config.get("mode") == "baseline" and method_set:
    yield (
      f"--config.hybrid.method={method_set!r} is set but --config.mode='baseline' trains the plain baseline, "
      f"not the method: set --config.mode=hybrid to train {method_set!r}, or --config.hybrid.method='' for the "
      "baseline (outer momentum in baseline mode is --config.optim.outer_every)"
    )
  if blocks is None and config.get("mode") == "hybrid" and "hybrid" not in config:
    yield (
      "--config.hybrid is missing: --config.mode=hybrid needs the hybrid block "
      "(hybridjax.config.default_hybrid_config())"
    )


def _trainer_relations(config: ml_collections.ConfigDict, whole: bool) -> Iterator[str]:
  t = config.trainer
  if t.batch_size % t.grad_accum:
    yield (
      f"--config.trainer.batch_size ({t.batch_size}) must be divisible by --config.trainer.grad_accum ({t.grad_accum})"
    )
  hybrid = config.get("hybrid")
  # Otherwise the whole run is WARMUP: a baseline run with extra cost.
  if whole and config.get("mode") == "hybrid" and hybrid and hybrid.enable_predict and hybrid.warmup_steps >= t.steps:
    yield (
      f"--config.hybrid.warmup_steps ({hybrid.warmup_steps}) must be < --config.trainer.steps ({t.steps}) for a "
      "hybrid run to ever predict; lower --config.hybrid.warmup_steps or use --config.mode=baseline"
    )


def _schedule_relations(config: ml_collections.ConfigDict) -> Iterator[str]:
  o = config.optim
  if o.decay_steps and o.decay_steps <= o.warmup_steps:
    yield (
      f"--config.optim.decay_steps ({o.decay_steps}) must be 0 (decay over the whole run) or "
      f"> --config.optim.warmup_steps ({o.warmup_steps})"
    )
  steps = config.get("trainer", {}).get("steps")
  # A warm-up as long as the run never reaches the peak learning rate, nor decays: a run of a few
  # steps with the default warm-up is a mistake, not a run.
  if steps is not None and o.warmup_steps and o.warmup_steps >= steps:
    fix = f"below {steps} (e.g. {max(steps // 10, 1)}), or 0 for no warm-up" if steps > 1 else "to 0"
    yield (
      f"--config.optim.warmup_steps ({o.warmup_steps}) is at least the run's length (--config.trainer.steps="
      f"{steps}): the learning rate would never reach its peak --config.optim.learning_rate nor decay; set "
      f"--config.optim.warmup_steps {fix}"
    )
  yield from optim_lib.relation_errors(o, steps)


def _hybrid_relations(config: ml_collections.ConfigDict, whole: bool, method: registry.Method | None) -> Iterator[str]:
  h = config.hybrid
  if h.steps_per_call != 1 and h.dispatch != "switch":
    yield (
      f"--config.hybrid.steps_per_call ({h.steps_per_call}) > 1 needs --config.hybrid.dispatch="
      "'switch' (host dispatch reads the device after every step); set one or the other"
    )
  yield from method_errors(config, check_relations=whole, method=method)


def validate(
  config: ml_collections.ConfigDict, *, blocks: tuple[str, ...] | None = None, method: registry.Method | None = None
) -> None:
  """Checks every declared field of `config` and the relations between them; raises `ValueError`
  naming each bad field and the fix.

  Args:
    config: the experiment config.
    blocks: check only fields under these top-level keys (default: all present).
    method: the config's method, resolved already (default: loaded from `hybrid.method`).
  """
  errors = [*field_errors(config, blocks), *_mode_errors(config, blocks)]
  if not errors:
    try:
      resolved = method or config_lib.resolve_method(config)
    except ValueError:
      resolved = None  # the method's own error comes from `method_errors` below
    errors += unknown_field_errors(config, resolved, blocks=blocks)
  if not errors:
    whole = blocks is None
    relations = {
      "trainer": lambda: _trainer_relations(config, whole),
      "optim": lambda: _schedule_relations(config),
      "model": lambda: [f"--config.{e}" for e in gpt2.relation_errors(config.model.to_dict())],
      "hybrid": lambda: _hybrid_relations(config, whole, method),
    }
    for block, block_errors in relations.items():
      if block in config and (whole or block in blocks):
        errors += block_errors()
    if whole or "mesh" in blocks or "distributed" in blocks:
      errors += sharding.mesh_errors(config, n_devices=None)[0]
  schema.raise_invalid(errors)


def check_config(config: ml_collections.ConfigDict, method: registry.Method) -> None:
  """Every check of a run's config alone: `validate`, a user's method module's names
  (`registry.check_method_names`), and a declared block set under another name
  (`misnamed_block_errors`)."""
  validate(config, method=method)
  registry.check_method_names(method)
  schema.raise_invalid(misnamed_block_errors(config, method))


def declared_fields(method: registry.Method | None = None) -> dict[str, schema.Field]:
  """Every field an experiment config may hold at its top level and in its `DECLARED` blocks, by
  dotted name: the top level's, the blocks', the built-in methods' blocks' and `method`'s (a user's)."""
  methods = [registry.load_method(name) for name in registry.BUILTIN_METHODS] + [method] * (method is not None)
  fields = {f.name: f for f in config_lib.TOP_FIELDS}
  fields |= {f"{block}.{f.name}": f for block, declared in DECLARED.items() for f in declared}
  return fields | {f"hybrid.{m.config_key}.{f.name}": f for m in methods if m.config_key for f in m.fields}


def _nearest(name: str, names: Iterable[str], cutoff: float) -> str | None:
  """The name of `names` nearest `name` (difflib's ratio at least `cutoff`), else None."""
  near = difflib.get_close_matches(name, names, n=1, cutoff=cutoff)
  return near[0] if near else None


def unknown_field_errors(
  config: ml_collections.ConfigDict, method: registry.Method | None = None, *, blocks: tuple[str, ...] | None = None
) -> list[str]:
  """A line for each key of `config` that is no declared field (`declared_fields`), naming it and
  the nearest valid one: a misspelt key set from Python (`config.trainer.stepz = 50`) would
  otherwise train on the default, without a word. A block of the config's own outside `DECLARED`
  (a task's, e.g. `mlp`) is left to its owner."""
  known = sorted(declared_fields(method))
  errors = []
  for name in config_lib.flatten(config):
    top, _, rest = name.partition(".")
    if name in known or (blocks is not None and top not in blocks):
      continue
    block = top if top in DECLARED else _nearest(top, DECLARED, 0.8)
    if rest and block is None:
      continue  # a block of the config's own (a task's, e.g. `mlp`), not a misspelt declared one
    # Its spelling; else (a misspelt block name, `trainr.steps`) the nearest field of the nearest block.
    nearest = _nearest(name, known, 0.6) or (block and rest and _nearest(f"{block}.{rest}", known, 0.5))
    hint = f"did you mean --config.{nearest}? " if nearest else "(docs/config.md lists the fields) "
    errors.append(
      f"--config.{name} is not a field of the config: {hint}A misspelt key would leave the field it "
      "meant at its default; rename or remove it"
    )
  return errors


def method_errors(
  config: ml_collections.ConfigDict, *, check_relations: bool = True, method: registry.Method | None = None
) -> list[str]:
  """The problems of `config.hybrid`'s method: a name that loads no method, its block's fields
  (`method.fields`), and, with `check_relations` in a hybrid run, its checks on the whole config
  (`method.check`) and what it composes with (outer momentum runs with a method only if the method
  declares it in `COMPOSES_WITH`). Each names the field and the fix."""
  h = config.hybrid
  name = config_lib.method_name(config)
  try:
    method = method or registry.load_method(name)
  except ValueError as e:
    return [str(e)]
  errors = []
  key = method.config_key
  if key:
    if key not in h:
      return [
        f"--config.hybrid.{key} is missing: method {name!r} reads its settings there "
        f"(hybridjax.config.with_method_block(config) adds its defaults)"
      ]
    errors = schema.errors(f"hybrid.{key}", method.fields, config_lib.flatten(h[key]))
  if errors or not check_relations or config.get("mode") != "hybrid":
    return errors
  if method.advances_schedule and h.steps_per_call != 1:
    errors.append(
      f"--config.hybrid.method={name!r} decides on the device whether a step uses its batch and how far it "
      "advances the schedule, so the host reads the data position after each step: set "
      f"--config.hybrid.steps_per_call=1 (got {h.steps_per_call})"
    )
  outer_every = config.get("optim", {}).get("outer_every", 0)
  if outer_every and "outer_momentum" not in method.composes_with and name != "outer_momentum":
    errors.append(
      f"--config.optim.outer_every ({outer_every}) turns on outer momentum, which method {name!r} does not "
      "compose with (its COMPOSES_WITH): set --config.optim.outer_every=0, or --config.mode=baseline"
    )
  return errors + list(method.check(config))


field_defaults = identity.field_defaults  # what a field missing from an older run's config meant


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
  known = declared_fields(method)
  errors = []
  for top, block in config.items():
    if top in DECLARED or not hasattr(block, "items"):
      continue
    fields = sorted(config_lib.flatten(block))
    for near in difflib.get_close_matches(top, DECLARED, n=3, cutoff=NEAR_BLOCK_CUTOFF):
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


# --- hybrid settings with no effect ----------------------------------------------------------------


def _setting_readers(
  flat: dict[str, Any], ref_flats: list[dict[str, Any]], prefix: str, given: Sequence[str] = ()
) -> tuple[Callable, Callable]:
  """For the fields of `flat` (a block's, `prefix` its flag's prefix): whether one is set (in `given`,
  or its value none of `ref_flats`' values of it), and the flags of some, each with its default (the
  first reference's)."""
  default = ref_flats[0] if ref_flats else {}

  def is_set(field: str) -> bool:
    return field in flat and (field in given or all(r.get(field, "<absent>") != flat[field] for r in ref_flats))

  def listed(fields: Iterable[str]) -> str:
    return ", ".join(
      f"--config.{prefix}{f}={flat[f]!r}" + (f" (default {default[f]!r})" if f in default else "") for f in fields
    )

  return is_set, listed


def _them(fields: Collection) -> tuple[str, str]:
  """The verb and pronoun for `fields`: ('has', 'it') for one, ('have', 'them') for more."""
  return ("has", "it") if len(fields) == 1 else ("have", "them")


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
  is_set, listed = _setting_readers(flat, [_json_flat(r.hybrid) for r in references if "hybrid" in r], "hybrid.")
  # What the run does not read: every hybrid field in baseline mode, another built-in method's block
  # in hybrid mode (`identity.comparable`).
  read = identity.comparable(config, method)
  unread = [f for f in sorted(flat) if f"hybrid.{f}" not in read and f != "method" and is_set(f)]
  if config.mode == "baseline":
    verb, obj = _them(unread)
    return [
      f"{listed(unread)} {verb} no effect: --config.mode='baseline' trains the plain baseline, which reads no "
      f"hybrid setting. Set --config.mode=hybrid to train with {obj}, or leave {obj} at the default "
      "(hybridjax.default_config())"
    ] * bool(unread)
  name, errors = config_lib.method_name(config), []
  for other in registry.BUILTIN_METHODS:
    key = registry.load_method(other).config_key
    fields = [f for f in unread if f.startswith(f"{key}.")]
    if fields:
      verb, obj = _them(fields)
      errors.append(
        f"{listed(fields)} {verb} no effect: the block configures method {other!r}, but this run trains {name!r} "
        f"(--config.hybrid.method). Set --config.hybrid.method={other} to train that method, or leave {obj} at the "
        "default"
      )
  # The generic controller's settings (`hybrid.context.ControllerSettings`) by their config fields.
  control_fields = {f.name.rsplit(".", 1)[-1]: f.name for f in config_lib.HYBRID_FIELDS}
  for setting, forced in sorted((control or {}).items()):
    field = control_fields.get(setting)
    if not is_set(field) or flat[field] == forced:
      continue
    errors.append(
      f"{listed([field])} has no effect: method {name!r} sets it to {forced!r} (its control(), "
      "docs/methods.md), whatever the config says. Leave it at the default, or train a method that reads it"
    )
  return errors


# --- optimizer and trainer settings with no effect ------------------------------------------------


def _words(names: list[str]) -> str:
  """'a', 'a and b', 'a, b and c'."""
  return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def optimizer_setting_errors(
  config: ml_collections.ConfigDict, references: Sequence[ml_collections.ConfigDict], given: Sequence[str] = ()
) -> list[str]:
  """A line for each `config.optim` or `config.trainer` field that is set where the run will not
  read it, naming the field and the fix, from the fields' declarations (`optim.FIELDS`,
  `config.TRAINER_FIELDS`):

  * a field the optimizer `optim.name` does not declare (`optimizers.OPTIMIZERS`); the fix names the
    fields it reads with a role in common (`schema.Field.roles`), else the optimizers that read it.
    Under a user's optimizer (`train(tx=...)`, any name that is not a built-in one) every optimizer
    field, since that optimizer is used as given;
  * a field whose declaration says this config's run does not read it (`schema.Field.unread`: a
    decay fraction without 'wsd', a head field on a tied head, an averaging beta without averaging).

  A field is set when it is in `given` (the command line's: refused whatever its value), or when its
  value is none of the `references`' values of it (the config's preset, or `default_config()`).
  """
  flat = {f"{b}.{k}": v for b in ("optim", "trainer") for k, v in _json_flat(config.get(b) or {}).items()}
  is_set, listed = _setting_readers(flat, [_json_flat(r) for r in references], "", given)
  name = config.optim.name
  decl = optim_lib.OPTIMIZERS.get(name)
  errors, reported = [], set()
  if decl is None:  # a user's optimizer: used as given
    unread = {f"optim.{f.name}": f for f in optim_lib.OPTIMIZER_FIELDS if is_set(f"optim.{f.name}")}
    if unread:
      verb, obj = _them(unread)
      hints = [f.in_your_optimizer.format(value=flat[k]) for k, f in unread.items() if f.in_your_optimizer]
      build = f" (e.g. {'; '.join(hints)})" if hints else ""
      schedule = [f.name for f in optim_lib.RUN_FIELDS if f.name != "name" and not f.name.startswith("outer_")]
      errors.append(
        f"{listed(unread)} {verb} no effect: --config.optim.name={name!r} names your own optimizer (train(tx=...)), "
        f"which is used as given (optim.resolve_optimizer): of config.optim it reads only the schedule's fields "
        f"({', '.join(schedule)}) and outer momentum's. Build {obj} into the optimizer you pass{build}, and leave "
        f"{obj} at the default"
      )
      reported |= set(unread)
  else:
    for f in optim_lib.OPTIMIZER_FIELDS:
      key = f"optim.{f.name}"
      if f in decl.fields or not is_set(key):
        continue
      reported.add(key)
      instead = [g.name for g in decl.fields if set(g.roles) & set(f.roles)]
      if instead:
        fix = (
          f"{name!r} reads --config.optim.{_words(instead)} instead: set {'those' if len(instead) > 1 else 'that'}, "
          f"or leave --config.{key} at the default"
        )
      else:
        readers = [repr(o.name) for o in optim_lib.OPTIMIZERS.values() if f in o.fields]
        one = len(readers) == 1
        fix = (
          f"Only {_words(readers)} {'reads' if one else 'read'} it: set --config.optim.name to "
          f"{'it' if one else 'one of them'} to train with it, or leave it at the default"
        )
      errors.append(
        f"{listed([key])} has no effect: --config.optim.name={name!r} does not read it ({decl.summary}; "
        f"optim.make_optimizer). {fix}"
      )
  for block, fields in (("optim", optim_lib.FIELDS), ("trainer", config_lib.TRAINER_FIELDS)):
    for f in fields:
      key = f"{block}.{f.name}"
      if f.unread and key not in reported and is_set(key) and (why := f.unread(config)):
        errors.append(f"{listed([key])} has no effect: {why}, or leave it at the default")
  return errors


def check_inert_settings(
  config: ml_collections.ConfigDict,
  method: registry.Method,
  references: Sequence[ml_collections.ConfigDict] | None = None,
  *,
  control: Mapping[str, Any] | None = None,
  given: Sequence[str] = (),
) -> None:
  """Refuses `config` when `inert_setting_errors` (hybrid settings) or `optimizer_setting_errors`
  (optimizer settings) finds a setting with no effect. `references`: default
  `reference_configs(config, method)`."""
  if references is None:
    references = reference_configs(config, method)
  schema.raise_invalid(
    inert_setting_errors(config, method, references, control=control)
    + optimizer_setting_errors(config, references, given)
  )
