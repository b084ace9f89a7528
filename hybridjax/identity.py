"""A run's config identity: what two configs of a run compare by, so that a resume (`checkpoint`:
the checkpoint's config and the config given) and a published record (`bench.record`: the record's
config and today's) read one definition of "the same run".

A config compares as `comparable` makes it: its leaves by dotted name, spelt as today (the earlier
names of a field read as today's), without what its run does not read. A field one side lacks (its
config written before the field existed) reads as its default (`field_defaults`); the fields declared
runtime (`runtime_fields`) say how or where a run executes, not what it trains.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax import data as data_lib
from hybridjax import registry
from hybridjax.models import gpt2


def runtime_fields(*kinds: str) -> frozenset[str]:
  """Every field declared runtime (`schema.Field.runtime`) of `kinds` ('resume', 'host'; default
  both), by dotted name: the top level's, every block's of `config.BLOCKS`, and the GPT-2 task's data
  block's (its token cache)."""
  kinds = kinds or ("resume", "host")
  blocks = {**config_lib.BLOCKS, "data": data_lib.DATA_FIELDS}
  names = {f.name for f in config_lib.TOP_FIELDS if f.runtime in kinds}
  return frozenset(names | {f"{b}.{f.name}" for b, fields in blocks.items() for f in fields if f.runtime in kinds})


def field_defaults() -> dict[str, Any]:
  """The default of every field (as its JSON record holds it): `config.default_config`'s, the built-in
  methods' blocks and the GPT-2 model's. What a field missing from an older run's saved config meant."""
  defaults = config_lib.flatten(json.loads(config_lib.default_config().to_json()))
  defaults |= {f"model.{f.name}": f.default for f in gpt2.FIELDS if f.default is not dataclasses.MISSING}
  return json.loads(json.dumps(defaults))


def comparable(
  config: ml_collections.ConfigDict | Mapping[str, Any], method: registry.Method | None = None
) -> dict[str, Any]:
  """`config`'s leaves by dotted name (as its JSON record holds them), as two configs of a run
  compare: `hybrid.method` as the method it names ('' is the default method; `hybrid.predictor`, its
  earlier name); the default method's fields at their place today (`hybrid.<its block>.<field>`)
  where an older config holds them flat in the hybrid block (its `beta` as `hybrid.<method>_beta`);
  in baseline mode no hybrid field (the baseline reads none), in hybrid mode no block of a built-in
  method the run does not train (`method`: the config's, resolved already; default: by its name)."""
  as_dict = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  flat = config_lib.flatten(json.loads(json.dumps(as_dict)))
  if "hybrid.predictor" in flat:
    flat.setdefault("hybrid.method", flat.pop("hybrid.predictor"))
  if "hybrid.method" in flat:
    flat["hybrid.method"] = flat["hybrid.method"] or config_lib.DEFAULT_METHOD
  default = registry.load_method(config_lib.DEFAULT_METHOD)
  block, own = f"hybrid.{default.config_key}.", {f.name.split(".")[0] for f in default.fields}
  renamed = {f"{config_lib.DEFAULT_METHOD}_beta": "beta"}
  for k in [k for k in flat if k.startswith("hybrid.")]:
    head, dot, rest = k.removeprefix("hybrid.").partition(".")
    if (field := renamed.get(head, head)) in own:  # one of the default method's fields, flat in an older config
      flat.setdefault(block + field + dot + rest, flat.pop(k))
  if flat.get("mode") == "baseline":
    return {k: v for k, v in flat.items() if not k.startswith("hybrid.")}
  if flat.get("mode") == "hybrid":
    try:
      trained = (method or registry.load_method(flat.get("hybrid.method", config_lib.DEFAULT_METHOD))).config_key
    except (ValueError, ImportError):  # a method that no longer loads: every block compared
      return flat
    unread = {registry.load_method(name).config_key for name in registry.BUILTIN_METHODS} - {trained, None}
    flat = {k: v for k, v in flat.items() if not any(k.startswith(f"hybrid.{key}.") for key in unread)}
  return flat
