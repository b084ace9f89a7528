"""GPT-2 on Shakespeare: baseline or hybrid training.

Read with `ml_collections.config_flags`:

  python -m experiments.gpt2_small --config=experiments/configs/gpt2_small.py:tiny
  python -m experiments.gpt2_small --config=experiments/configs/gpt2_small.py:124m \
      --config.trainer.steps=300 --config.mode=hybrid

Presets: `tiny` (CPU, minutes; the default), `small` (CPU, under an hour), `124m` (GPT-2 Small, GPU).
Comma-separated variants follow: `tiny,micro` is a one-layer model with a small dynamics model that
trains in seconds (the tests and quick benchmarks use it); `tiny,speedrun` is the whole speedrun
recipe (`hybridjax.bench.speedrun`) at its published tuned LR; its tricks apply again after the
command line's overrides (`after_command_line`), so a value a trick derives follows them.
"""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections

from hybridjax import config as config_lib
from hybridjax import data as data_lib
from hybridjax import schema
from hybridjax.models import gpt2

# Per-preset training settings. The model shapes come from `gpt2.PRESETS`.
_TRAINER = {
  "tiny": dict(steps=600, batch_size=16, eval_every=100, eval_batches=8, log_every=20),
  "small": dict(steps=3000, batch_size=32, eval_every=250, eval_batches=16, log_every=50),
  "124m": dict(steps=5000, batch_size=32, eval_every=250, eval_batches=20, log_every=10),
}
_OPTIM = {
  "tiny": dict(learning_rate=3e-3, warmup_steps=50),
  "small": dict(learning_rate=2e-3, warmup_steps=150),
  "124m": dict(learning_rate=6e-4, warmup_steps=200),
}


VARIANTS = ("micro", "speedrun")
# The speedrun recipe's published tables, one per benchmark preset (`recipe-<preset>.json`).
_RECIPE_RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results", "recipe")
# The record's own peak LR of the Muon matrices (the other groups at their ratios of it), for a preset
# whose recipe was never tuned here.
_RECORD_MUON_LR = 0.05


def _micro(c: ml_collections.ConfigDict) -> None:
  """One layer, d_model 32, context 32, batch 4, a small RSSM, short warm-ups."""
  c.model.update(n_layer=1, d_model=32, n_head=2, n_ctx=32)
  c.trainer.batch_size = 4
  c.optim.warmup_steps = 5
  c.hybrid.update(warmup_steps=10, full_steps=5)
  c.hybrid.velocity.update(history_size=16, window=8)
  c.hybrid.velocity.rssm.update(deter=32, latent=8, hidden=32, ensemble=2)


def _speedrun(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The whole speedrun recipe, as the benchmark applies it (`hybridjax.bench.speedrun.TRICKS`, every
  trick in order), at the peak LR and with the iterate (averaged or raw) that its published table
  chose for this preset on the tuning seeds (`docs/results/recipe/recipe-<preset>.json`); a preset
  with no published table gets the record's own LRs, untuned here. `notes` says which."""
  from hybridjax.bench import speedrun

  c = speedrun.apply_tricks(c, list(speedrun.TRICKS))
  path = os.path.join(_RECIPE_RESULTS, f"recipe-{c.preset}.json")
  if not os.path.exists(path):
    c.optim.learning_rate = _RECORD_MUON_LR
    c.notes = (
      f"{SPEEDRUN_NOTE} with the record's LRs (Muon {_RECORD_MUON_LR}, the other groups at their ratios): "
      f"untuned at {c.preset} (no docs/results/recipe/recipe-{c.preset}.json); tune them before trusting a comparison"
    )
    return c
  with open(path, encoding="utf-8") as f:
    published = json.load(f)
  last = published["figures"][-1]
  c.optim.learning_rate = float(last["lr"])
  if last["iterate"] == "averaged":
    c.trainer.update(averaging="ema", averaging_beta=float(last["beta"]))
  current = {name: t.record for name, t in speedrun.TRICKS.items()}
  stale = (
    ""
    if published["records"] == current
    else (
      "; that table measured an earlier definition of the recipe (its tricks differ from today's), so the LR "
      "was tuned before today's tricks: re-measure it before trusting a comparison"
    )
  )
  c.notes = (
    f"{SPEEDRUN_NOTE} at the LR ({last['lr']}) and iterate ({last['iterate']}) that "
    f"docs/results/recipe/recipe-{c.preset}.json tuned for its last step{stale}"
  )
  return c


def reapply_tricks(config: ml_collections.ConfigDict, names: list[str], given: list[str]) -> ml_collections.ConfigDict:
  """`config` with the speedrun tricks `names` applied again, in order, to its current values, except
  to the fields `given` (dotted; a block's name covers its fields), which keep their values: a trick's
  value derived from another field (the momentum warm-up from `trainer.steps`, the attention scale
  from the head dimension, the value-embedding tables from `n_layer`) follows that field's value."""
  from hybridjax.bench import speedrun

  c = ml_collections.ConfigDict(config.to_dict())
  for name in names:
    changes = speedrun.TRICKS[name].changes(c)
    c.update_from_flattened_dict({k: v for k, v in changes.items() if not _is_given(k, given)})
  return c


def _is_given(field: str, given: list[str]) -> bool:
  return any(field == g or field.startswith(g + ".") for g in given)


def after_command_line(config: ml_collections.ConfigDict, arg: str, fields: list[str]) -> ml_collections.ConfigDict:
  """`get_config(arg)` once the command line's overrides (`fields`, dotted) are applied (`hybridjax.cli`
  calls it): for `speedrun`, every trick applied again to the overridden config, the fields the
  command line set kept as given, so a value a trick derives follows the overrides
  (`--config.trainer.steps=3000` gets the recipe's warm-up of 500/3200 of 3000 steps, not 600's)."""
  if "speedrun" not in (arg or "tiny").split(",")[1:]:
    return config
  from hybridjax.bench import speedrun

  return reapply_tricks(config, list(speedrun.TRICKS), fields)


SPEEDRUN_NOTE = "the speedrun recipe"
"""How a speedrun config's `notes` begins (`_speedrun`)."""


def stale_derived_fields(config: ml_collections.ConfigDict) -> dict[str, tuple[object, object]]:
  """For a speedrun config (`get_config('<preset>,speedrun')`), each value a trick derives from another
  field (the momentum warm-up from `trainer.steps`, the attention scale from the head dimension, the
  value-embedding tables from `n_layer`) that no longer follows it: {dotted field: (its value, the
  value the tricks give it now)}. From the command line `after_command_line` derives them again; from
  Python, a field changed after `get_config` leaves them as the preset derived them.

  A value is stale when it is what the tricks derived for a preset (any of its variants) and not what
  they derive for this config. One the caller chose for a trick's field is kept: it is no preset's."""
  if not str(config.get("notes", "")).startswith(SPEEDRUN_NOTE):
    return {}
  from hybridjax.bench import speedrun

  now = config_lib.flatten(speedrun.apply_tricks(config, list(speedrun.TRICKS)))
  presets = [get_config(",".join([config.preset, *v, "speedrun"])) for v in ((), ("micro",))]
  flat = config_lib.flatten(config)
  return {
    k: (flat.get(k), v)
    for k, v in now.items()
    if flat.get(k) != v and any(config_lib.flatten(p).get(k) == flat.get(k) for p in presets)
  }


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  """Returns the experiment config for `arg`: a preset ('tiny', 'small' or '124m'), optionally
  followed by variants (`tiny,micro`)."""
  preset, *variants = (arg or "tiny").split(",")
  variants = list(dict.fromkeys(variants))  # a variant named twice is applied once
  for v in variants:
    if v not in VARIANTS:
      raise ValueError(
        f"unknown preset variant {v!r} in {arg!r}: use one of {list(VARIANTS)}, e.g. "
        "--config=experiments/configs/gpt2_small.py:tiny,micro"
      )
  if preset not in gpt2.PRESETS:
    raise ValueError(
      f"unknown preset {preset!r}: use one of {sorted(gpt2.PRESETS)}, e.g. "
      "--config=experiments/configs/gpt2_small.py:tiny"
    )
  c = ml_collections.ConfigDict()
  c.preset = preset
  c.mode = "baseline"  # 'baseline' (plain optax loop) | 'hybrid'
  c.seed = 0
  # 'auto': resume a run in --workdir if its config matches, refuse otherwise;
  # 'force': resume even if the stored config differs; 'never': refuse any existing run.
  c.resume = "auto"

  c.model = ml_collections.ConfigDict(dataclasses.asdict(gpt2.PRESETS[preset]))

  c.data = schema.block(data_lib.DATA_FIELDS)  # the GPT-2 task's data block, as `hybridjax.data` declares it
  if preset == "124m":
    c.data.tokenizer = "gpt2"

  c.optim = config_lib.default_optim_config()
  c.optim.update(_OPTIM[preset])

  c.trainer = config_lib.default_trainer_config()
  c.trainer.update(_TRAINER[preset])
  if preset == "124m":
    c.model.dtype = "bfloat16"

  c.hybrid = config_lib.default_hybrid_config()
  if preset == "tiny":
    # A dynamics model in proportion to a 0.45M-param model: the default (deter 256) costs ~20 ms,
    # a quarter of each real step on 2 CPU cores, and predicted no better (docs/experiments.md).
    c.hybrid.velocity.rssm.update(deter=64, hidden=64, latent=16)
  c.mesh = config_lib.default_mesh_config()  # default: data-parallel over every visible device
  c.distributed = config_lib.default_distributed_config()  # multi-host start-up (off)
  c.notes = ""  # what the preset's settings rest on, printed when a run starts
  if "micro" in variants:
    _micro(c)
  if "speedrun" in variants:
    c = _speedrun(c)
  c.preset = ",".join([preset, *variants])  # with its variants: what a field set from Python is compared with
  c.lock()  # a misspelt key fails at the assignment ("did you mean"), not trains the default
  return c
