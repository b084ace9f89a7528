"""The speedrun recipe's tricks as data, in its record's order, and what each changes in a config
(read by the recipe study and by the ladder's R6)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

from hybridjax import config as config_lib
from hybridjax.bench import arms as arms_lib
from hybridjax.bench.studies import Config, Record


@dataclasses.dataclass(frozen=True)
class Trick:
  """One step of the recipe: the record that introduced it and the config it changes."""

  name: str  # as the record history names it
  record: str  # the speedrun record(s) it comes from
  changes: Callable[[Config], Record]  # config -> {"block.field": value}
  # How a record's value is carried over to a smaller model where it is not copied as it stands.
  adapted: str = ""


def _value_embeds(c: Config) -> Record:
  # The record's 3 tables in 12 layers reach the first 3 and the last 3, half the layers: k =
  # n_layer // 4 tables, at least one, reach 2k layers (at 2 layers the one table reaches both).
  return {"model.value_embeds": max(1, int(c.model.n_layer) // 4)}


# Record #9 warmed Muon's momentum up over its first 500 of 3200 steps; the step keeps that share of
# the run (the records' later 300 of 1393 is a larger one).
MOMENTUM_WARMUP_FRACTION = 500 / 3200


# Record #20's attention scale, 0.12 at head_dim 128: with QK-norm, |q . k| <= head_dim, so the
# scores are bounded by 0.12 * 128 = 15.36, which the step keeps whatever the head dimension.
RECORD_SCORE_BOUND = 0.12 * 128


def _shortcuts(c: Config) -> Record:
  return {
    "model.embed_skips": True,
    "model.logit_softcap": 15.0,
    "model.value_residual": True,
    "optim.muon_momentum_warmup_steps": max(1, round(MOMENTUM_WARMUP_FRACTION * int(c.trainer.steps))),
    "optim.muon_momentum_start": 0.85,
  }


def _attn_scale(c: Config) -> Record:
  head_dim = int(c.model.d_model) // int(c.model.n_head)
  return {"model.attn_scale": RECORD_SCORE_BOUND / head_dim, "model.init": "fan_in_0.5"}


TRICKS: dict[str, Trick] = {
  t.name: t
  for t in (
    Trick(
      "schedule",
      "#2 tuned LR: constant, then a linear cool-down over the last 40% to zero",
      lambda c: {"optim.schedule": "wsd", "optim.decay_fraction": 0.4, "optim.min_lr_ratio": 0.0},
    ),
    Trick(
      "rotary",
      "#2-#4 rotary embeddings, RMSNorm without parameters, no biases",
      lambda c: {"model.rotary": True, "model.rmsnorm": True},
    ),
    Trick(
      "muon",
      "#3-#4 Muon on the hidden matrices, AdamW (betas (0.9, 0.95), eps 1e-8) on the tied embedding and head; "
      "no LR warm-up, clipping or weight decay; PyTorch's default init (U(±1/√fan_in); #4's code, #3's is not "
      "published)",
      lambda c: {
        "optim.name": "muon_groups",
        "optim.grad_clip": 0.0,
        "optim.weight_decay": 0.0,
        "optim.warmup_steps": 0,
        "optim.tied_lr_ratio": 0.36,
        "optim.tied_b1": 0.9,
        "optim.tied_b2": 0.95,
        "optim.tied_eps": 1e-8,
        "model.init": "fan_in",
      },
      adapted="the tied matrix's LR 0.0036 over Muon's 0.1 * 0.0036 * √768 (its scale at width 768) = 0.36 of "
      "Muon's rate in optax's units",
    ),
    Trick(
      "modern_arch",
      "#5 ReLU², QK-norm, zero-init projections",
      lambda c: {"model.relu2": True, "model.qk_norm": True, "model.zero_init_proj": True},
    ),
    Trick(
      "untied_head",
      "#8 untied embedding and head (zero-initialised head), RMSNorm after the embedding",
      lambda c: {"model.untied_head": True, "model.embed_norm": True},
    ),
    Trick(
      "shortcuts",
      "#9 embedding skip connections, the value residual, Muon's momentum warm-up from 0.85, logit soft-cap "
      "(at #18's 15)",
      _shortcuts,
      adapted=f"the momentum warm-up over the record's share of the run, {MOMENTUM_WARMUP_FRACTION:.4g} N "
      "(500 of 3200 steps)",
    ),
    Trick("unet", "#11 U-net pattern skip connections", lambda c: {"model.unet_skips": True}),
    Trick(
      "value_embeds",
      "#14-#17 value embeddings in place of the value residual, U-net pattern (first and last layers)",
      lambda c: _value_embeds(c) | {"model.value_residual": False},
      adapted="n_layer // 4 tables (at least one), each into a first and a last layer: the record's 3 tables "
      "reach half of its 12 layers",
    ),
    Trick(
      "attn_scale",
      "#20 attention scale (0.12 at head_dim 128), matrices initialised at std 0.5/√fan_in",
      _attn_scale,
      adapted=f"the scale that keeps the record's bound on the QK-normed scores, {RECORD_SCORE_BOUND:.2f} / "
      "head_dim (0.12 at head_dim 128)",
    ),
  )
}


TRICKS_V1: dict[str, Trick] = {
  t.name: t
  for t in (
    TRICKS["schedule"],
    TRICKS["rotary"],
    Trick(
      "muon",
      "#3-#4 Muon on the hidden matrices, Adam on embeddings, head and scalars; no clipping or weight decay",
      lambda c: {"optim.name": "muon_groups", "optim.grad_clip": 0.0, "optim.weight_decay": 0.0},
    ),
    Trick(
      "modern_arch",
      "#5 ReLU², QK-norm, zero-init projections, the normalised embedding",
      lambda c: {"model.relu2": True, "model.qk_norm": True, "model.zero_init_proj": True, "model.embed_norm": True},
    ),
    Trick("untied_head", "#8 untied embedding and head (zero-initialised head)", lambda c: {"model.untied_head": True}),
    Trick(
      "embed_skips",
      "#9 embedding skip connections, logit soft-cap (at #18's 15)",
      lambda c: {"model.embed_skips": True, "model.logit_softcap": 15.0},
    ),
    TRICKS["unet"],
    Trick("value_embeds", "#14-#15 value embeddings, U-net pattern (first and last layers)", _value_embeds),
  )
}


TRICK_LIST_VERSION = 2
TRICK_LISTS = {1: TRICKS_V1, TRICK_LIST_VERSION: TRICKS}


def trick_list(result: Record) -> dict[str, Trick]:
  """The trick list a recipe.json was measured with: `TRICK_LISTS[result['trick_list']]`, the first
  list for a json written before the list had a version."""
  return TRICK_LISTS[int(result.get("trick_list", 1))]


def tricks_of(config: Config) -> list[str]:
  return arms_lib.names(config.benchmark.recipe.tricks)


def kept_fields(config: Config) -> list[str]:
  """The fields no trick changes (`benchmark.recipe.keep`): their values in `config` win; none in a
  training config (it has no benchmark block)."""
  return arms_lib.names(config.get("benchmark", {}).get("recipe", {}).get("keep", ""))


def keep_command_line(config: Config, fields: list[str]) -> Config:
  """`config` with the fields the command line set (`fields`, dotted) added to `benchmark.recipe.keep`,
  outside the benchmark block: a trick leaves them as given (`apply_tricks`)."""
  if "recipe" not in config.get("benchmark", {}):
    return config
  kept = kept_fields(config)
  config.benchmark.recipe.keep = ",".join(
    kept + [f for f in fields if not f.startswith("benchmark.") and f not in kept]
  )
  return config


def trick_changes(config: Config, name: str) -> tuple[Record, Record]:
  """(applied, kept): what trick `name` changes in `config`, and the changes it leaves out because
  `benchmark.recipe.keep` keeps the field ({field: the trick's value})."""
  keep = set(kept_fields(config))
  changes = TRICKS[name].changes(config)
  return {k: v for k, v in changes.items() if k not in keep}, {k: v for k, v in changes.items() if k in keep}


def apply_tricks(config: Config, names: list[str]) -> Config:
  """A copy of the benchmark `config` with the tricks `names` applied, in order; a field
  `benchmark.recipe.keep` keeps (one the command line set) keeps its value."""
  c = Config(config.to_dict())
  for name in names:
    c.update_from_flattened_dict(trick_changes(c, name)[0])
  return c


def kept_changes(config: Config) -> dict[str, Record]:
  """Per step of the recipe, the trick changes a kept field left out ({step: {field: [the trick's
  value, the value kept]}}); steps with none are absent."""
  out, c = {}, Config(config.to_dict())
  for name in tricks_of(config):
    applied, kept = trick_changes(c, name)
    if kept:
      out[name] = {k: [v, config_lib.flatten(c)[k]] for k, v in kept.items()}
    c.update_from_flattened_dict(applied)
  return out


def uses_muon(config: Config) -> bool:
  return config.optim.name in ("muon", "muon_groups")


def speedrun_config(config: Config) -> Config:
  """The whole recipe (`benchmark.recipe.tricks`, all applied) as a family of the protocol: the
  ladder's R6 and the `speedrun` family. Its sweep centres on `benchmark.recipe.muon_lr` when it
  uses Muon; its tuning ranks each run by its better iterate (`benchmark.iterate='best'`), so it
  averages only where averaging helps on the tuning seeds."""
  c = apply_tricks(config, tricks_of(config))
  if uses_muon(c):
    c.optim.learning_rate = float(config.benchmark.recipe.muon_lr)
  c.benchmark.iterate = "best"
  c.benchmark.family = f"speedrun-{c.optim.name}-{c.optim.schedule}"
  return c


# The published results (docs/results, beside the package) and the recipe records among them
# (docs/results/recipe/recipe-<preset>.json).
RESULTS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results"))
PUBLISHED = os.path.join(RESULTS, "recipe")


def shown_path(path: str) -> str:
  """`path` as a record shows it: relative to the repository where it lies inside it, else as given."""
  root, path_ = os.path.dirname(os.path.dirname(RESULTS)), os.path.abspath(path)
  return os.path.relpath(path_, root) if path_.startswith(root + os.sep) else path


def recipe_record(config: Config, study: str) -> tuple[str, Record]:
  """(its path as shown, the record) of the recipe record the study `study` reads (`benchmark.<study>.lrs_from`;
  '': the published one at `benchmark.preset`); a missing one is refused naming that field."""
  b = config.benchmark
  path = str(b[study].lrs_from) or os.path.join(PUBLISHED, f"recipe-{b.preset}.json")
  if not os.path.exists(path):
    raise ValueError(
      f"no recipe record at {path}: run the recipe at this preset first, or give one with "
      f"--config.benchmark.{study}.lrs_from"
    )
  with open(path) as f:
    return shown_path(path), json.load(f)


TUNED = ("lr", "beta", "iterate")  # what a recipe record's step tuned


def row_side(config: Config, shown: str, result: Record, row: str, fix: str) -> tuple[Config, Record]:
  """(the config, its tuned settings: lr, beta, iterate) of the recipe record `result`'s (`shown`) cumulative
  row `row`: its tricks through that row, at the LR the record tuned for it, with no method arm. A record
  without the row is refused, with `fix`."""
  names, steps = list(result["tricks"]), result["step_runs"]
  if row not in names or row not in steps:
    raise ValueError(f"{shown} holds no {row!r} step (it ran {names}): {fix}")
  c = apply_tricks(config, names[: names.index(row) + 1])
  settings = {k: steps[row][k] for k in TUNED}
  c.optim.learning_rate = float(settings["lr"])
  c.benchmark.methods = ""
  return c, settings


def tuned_rows(result: Record, field: str) -> dict[str, Record]:
  """{row: {lr, beta, iterate, from}} for every row of today's recipe, from a recipe record: its step
  of the same name, else the step at the same place in its trick list, else (a row past its list's
  end, such as `attn_scale` in the first list's records) its last step. A record of part of the
  recipe is refused naming `field`, the config field that gives another."""
  steps, listed = result["step_runs"], list(trick_list(result))
  if missing := [t for t in listed if t not in steps]:
    raise ValueError(
      f"the recipe record holds no step {missing} of its trick list (it ran {sorted(steps)}): give the record "
      f"of a whole recipe with --config.{field}"
    )
  out = {}
  for k, row in enumerate(TRICKS):
    source = row if row in steps else (listed[k] if k < len(listed) else listed[-1])
    out[row] = {key: steps[source][key] for key in TUNED} | {"from": source}
  return out


def is_speedrun_family(config: Config) -> bool:
  """Whether `config` is the `speedrun` family (`experiments/configs/benchmark.py:<preset>,speedrun`:
  the whole recipe, `speedrun_config`) run as a family."""
  return str(config.benchmark.get("study", "family")) == "family" and str(config.benchmark.family).startswith(
    "speedrun-"
  )
