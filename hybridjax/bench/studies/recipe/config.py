"""The recipe's block of the benchmark config (`benchmark.recipe`) and its checks."""

from __future__ import annotations

import ml_collections

from hybridjax import config as config_lib
from hybridjax.bench import record as record_lib
from hybridjax.bench.speedrun import TRICKS, apply_tricks, kept_fields, tricks_of

RECORD = "recipe-{preset}.json"  # its record, whose invocations a resumed recipe extends
PUBLISH_IGNORES = record_lib.other_studies("recipe")  # the blocks a recipe's record compares without


def add_defaults(block: ml_collections.ConfigDict, preset: str) -> None:
  """The recipe's fields (`benchmark.recipe`; R6, the whole recipe, reads them too)."""
  block.tricks = ",".join(TRICKS)  # cumulative, in the record's order
  # Fields no trick changes: their values as given win (comma-separated, dotted). The command line's
  # --config.<field> overrides are added by `python -m experiments.benchmark` (`speedrun.keep_command_line`).
  block.keep = ""
  block.muon_lr = 0.02 if preset != "124m" else 0.05  # the centre of a Muon step's LR sweep
  block.budgets = (3.0, 4.0)  # the R4 anchor's budget curve extended past 2N, to read the speed-ups on
  block.budget_extensions = (6.0, 8.0)  # added one at a time while a step's loss lies below the curve


def validate(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Checks the recipe's fields; returns every cumulative step's config, which the skeleton checks
  too (an option the model cannot take, e.g. U-net skips with an odd layer count, fails before any
  training)."""
  b, recipe = config.benchmark, config.benchmark.recipe
  names = tricks_of(config)
  errors = []
  unknown = [n for n in names if n not in TRICKS]
  if unknown or not names:
    errors.append(f"--config.benchmark.recipe.tricks={recipe.tricks!r}: give tricks from {','.join(TRICKS)}")
  if len(set(names)) != len(names):
    errors.append(f"--config.benchmark.recipe.tricks={recipe.tricks!r} names a trick twice")
  budgets = list(recipe.budgets) + list(recipe.budget_extensions)
  if any(float(f) <= max(float(x) for x in b.budgets) for f in budgets) or budgets != sorted(budgets):
    errors.append(
      "--config.benchmark.recipe.budgets and recipe.budget_extensions must be increasing factors of N beyond "
      f"benchmark.budgets (max {max(b.budgets)}), got {tuple(recipe.budgets)} and {tuple(recipe.budget_extensions)}"
    )
  if not float(recipe.muon_lr) > 0:
    errors.append(f"--config.benchmark.recipe.muon_lr must be > 0, got {recipe.muon_lr}")
  fields = set(config_lib.flatten(config))
  unknown = [f for f in kept_fields(config) if f not in fields]
  if unknown:
    errors.append(
      f"--config.benchmark.recipe.keep={recipe.keep!r} names {unknown}, not fields of the config: "
      "give dotted fields such as model.relu2"
    )
  if errors:
    raise ValueError("; ".join(errors))
  # A recipe of another config published there would be replaced (`record.check_publish`).
  record_lib.check_publish(config, str(b.publish), RECORD.format(preset=b.preset), PUBLISH_IGNORES)
  return {
    f"the recipe's step {names[k - 1]!r} (with {names[: k - 1]} before it)": apply_tricks(config, names[:k])
    for k in range(1, len(names) + 1)
  }
