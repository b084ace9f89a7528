"""The variants study's block, `benchmark.variants`, and its checks."""

from __future__ import annotations

import os

from hybridjax import config as config_lib
from hybridjax import schema
from hybridjax.bench import record as record_lib
from hybridjax.bench.speedrun import PUBLISHED, TRICKS, apply_tricks, recipe_record, tuned_rows
from hybridjax.bench.studies import Config, Record, lrs_from
from hybridjax.bench.studies.variants.sets import SETS, Pair, VariantSet

RECORD = "variants-{set}-{preset}.json"  # its record, whose invocations a resumed study extends
# The smallest preset the study runs at as it stands: its pairs need a whole recipe's record (each row's
# tuned LR; `tiny`'s is published) and a model of 2 layers or more (the value residual reads a later
# layer). `quick` has neither: its recipe trains two tricks on a one-layer model.
SMALLEST_PRESET = "tiny"


F = schema.Field
FIELDS = (
  F("set", "fixes", schema.check_choice(*SETS), "the set of pairs it runs (`sets.SETS`)"),
  lrs_from("whose tuned rows give each pair its LR, averaging beta and iterate"),
  F(
    "lr_points",
    3,
    schema.check_int(2),
    "a tuned set: each side's first LR grid (extended while its best sits at an edge)",
  ),
)
"""`benchmark.variants`'s fields."""
del F


def set_of(config: Config) -> VariantSet:
  """The set `benchmark.variants.set` names."""
  return SETS[str(config.benchmark.variants.set)]


def pairs_of(config: Config) -> tuple[Pair, ...]:
  """The pairs of that set, in its order."""
  return set_of(config).pairs


def side_config(config: Config, pair: Pair, side: str) -> Config:
  """The benchmark config of one side ('before' or 'after') of `pair`: the recipe through its row,
  less the tricks the before side drops, then the side's fields."""
  names = list(TRICKS)
  c = apply_tricks(config, [n for n in names[: names.index(pair.row) + 1] if n not in pair.dropped(side)])
  c.update_from_flattened_dict(pair.fields(side, config))
  c.benchmark.methods = ""
  return c


def row_settings(config: Config) -> tuple[str, dict[str, Record]]:
  """(the recipe record read, {row: {lr, beta, iterate, from}}): `speedrun.tuned_rows` of the
  record `benchmark.variants.lrs_from` names ('': the published one)."""
  shown, result = recipe_record(config, "variants")
  return shown, tuned_rows(result, "benchmark.variants.lrs_from")


def validate(config: Config) -> dict[str, Config]:
  """Checks the block; returns every side's config, which the skeleton checks too."""
  v = config.benchmark.variants
  if v.lrs_from and not os.path.exists(str(v.lrs_from)):
    raise ValueError(
      f"--config.benchmark.variants.lrs_from={v.lrs_from!r} does not exist: give a recipe record "
      "(recipe-<preset>.json), or '' for the published one"
    )
  preset = str(config.benchmark.preset)
  if not v.lrs_from and not os.path.exists(os.path.join(PUBLISHED, f"recipe-{preset}.json")):
    raise ValueError(
      f"the variants study does not run at `{preset}`: each pair starts from a row of the whole recipe at the LR "
      f"a recipe record tuned for it, and no recipe record is published for `{preset}`. The smallest preset where "
      f"it runs is `{SMALLEST_PRESET}`: --config=experiments/configs/benchmark.py:{SMALLEST_PRESET} "
      "--config.benchmark.study=variants (or give a whole recipe's record with --config.benchmark.variants.lrs_from)"
    )
  row_settings(config)  # a record that cannot give every row its LR fails here
  fields = set(config_lib.flatten(config))
  out = {}
  for pair in pairs_of(config):
    unknown = [f for f in {**pair.before, **pair.after} if f not in fields]
    if pair.row not in TRICKS or unknown or any(t not in TRICKS for t in pair.drop):
      raise ValueError(f"variant pair {pair.name!r}: row {pair.row!r} or fields {unknown} are not the recipe's")
    before, after = (side_config(config, pair, side) for side in ("before", "after"))
    if before.to_dict() == after.to_dict():
      raise ValueError(
        f"variant pair {pair.name!r}: its two sides are the same config, so it would read 'no difference' "
        f"having compared nothing (a field the command line set is kept over the tricks and the pair: "
        f"--config.benchmark.recipe.keep={config.benchmark.recipe.keep!r}): leave out the override of "
        f"{sorted({**pair.before, **pair.after})}, or run the pair without it"
      )
    out[f"pair {pair.name!r}, before"], out[f"pair {pair.name!r}, after"] = before, after
  record_lib.check_study_publish(config, "variants", RECORD)  # a record of another config there would be replaced
  return out
