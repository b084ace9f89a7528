"""The variants study's block, `benchmark.variants`, and its checks."""

from __future__ import annotations

import os

import ml_collections

from hybridjax import config as config_lib
from hybridjax.bench.speedrun import TRICKS, apply_tricks
from hybridjax.bench.studies.variants.sets import SETS, Pair, VariantSet


def add_defaults(block: ml_collections.ConfigDict, preset: str) -> None:
  """`benchmark.variants`: which set of pairs (`sets.SETS`), and the recipe record whose tuned rows
  give each pair its LR, averaging beta and iterate ('': the published `recipe-<preset>.json`)."""
  del preset
  block.set = "fixes"
  block.lrs_from = ""
  block.lr_points = 3  # a tuned set: each side's first LR grid (extended while its best sits at an edge)


def set_of(config: ml_collections.ConfigDict) -> VariantSet:
  return SETS[str(config.benchmark.variants.set)]


def pairs_of(config: ml_collections.ConfigDict) -> tuple[Pair, ...]:
  return set_of(config).pairs


def side_config(config: ml_collections.ConfigDict, pair: Pair, side: str) -> ml_collections.ConfigDict:
  """The benchmark config of one side ('before' or 'after') of `pair`: the recipe through its row,
  less the tricks the before side drops, then the side's fields."""
  names = list(TRICKS)
  drop = pair.drop if side == "before" else ()
  c = apply_tricks(config, [n for n in names[: names.index(pair.row) + 1] if n not in drop])
  c.update_from_flattened_dict(pair.fields(side, config))
  c.benchmark.methods = ""
  return c


def validate(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Checks the block; returns every side's config, which the skeleton checks too."""
  v = config.benchmark.variants
  if str(v.set) not in SETS:
    raise ValueError(f"--config.benchmark.variants.set={v.set!r}: give one of {', '.join(SETS)}")
  if v.lrs_from and not os.path.exists(str(v.lrs_from)):
    raise ValueError(
      f"--config.benchmark.variants.lrs_from={v.lrs_from!r} does not exist: give a recipe record "
      "(recipe-<preset>.json), or '' for the published one"
    )
  if int(v.lr_points) < 2:
    raise ValueError(
      f"--config.benchmark.variants.lr_points={v.lr_points}: give at least 2 (a sweep of one LR tunes nothing)"
    )
  fields = set(config_lib.flatten(config))
  out = {}
  for pair in pairs_of(config):
    unknown = [f for f in {**pair.before, **pair.after} if f not in fields]
    if pair.row not in TRICKS or unknown or any(t not in TRICKS for t in pair.drop):
      raise ValueError(f"variant pair {pair.name!r}: row {pair.row!r} or fields {unknown} are not the recipe's")
    for side in ("before", "after"):
      out[f"pair {pair.name!r}, {side}"] = side_config(config, pair, side)
  return out
