"""The recipe's fields of the benchmark block (recipe_*) and their checks."""

from __future__ import annotations

import ml_collections

from hybridjax import config as config_lib
from hybridjax.bench.speedrun import TRICKS, apply_tricks, kept_fields, tricks_of


def add_defaults(b: ml_collections.ConfigDict, preset: str) -> None:
  """The recipe's fields of the benchmark block `b` (R6, the whole recipe, reads them too)."""
  b.recipe = False  # deprecated, goes in the next release: benchmark.study='recipe'
  b.recipe_tricks = ",".join(TRICKS)  # cumulative, in the record's order
  # Fields no trick changes: their values as given win (comma-separated, dotted). The command line's
  # --config.<field> overrides are added by `python -m experiments.benchmark` (`speedrun.keep_command_line`).
  b.recipe_keep = ""
  b.recipe_muon_lr = 0.02 if preset != "124m" else 0.05  # the centre of a Muon step's LR sweep
  b.recipe_budgets = (3.0, 4.0)  # the R4 anchor's budget curve extended past 2N, to read the speed-ups on
  b.recipe_budget_extensions = (6.0, 8.0)  # added one at a time while a step's loss lies below the curve


def validate(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Checks the recipe's fields; returns every cumulative step's config, which the skeleton checks
  too (an option the model cannot take, e.g. U-net skips with an odd layer count, fails before any
  training)."""
  b = config.benchmark
  names = tricks_of(config)
  errors = []
  unknown = [n for n in names if n not in TRICKS]
  if unknown or not names:
    errors.append(f"benchmark.recipe_tricks={b.recipe_tricks!r}: give tricks from {','.join(TRICKS)}")
  if len(set(names)) != len(names):
    errors.append(f"benchmark.recipe_tricks={b.recipe_tricks!r} names a trick twice")
  budgets = list(b.recipe_budgets) + list(b.recipe_budget_extensions)
  if any(float(f) <= max(float(x) for x in b.budgets) for f in budgets) or budgets != sorted(budgets):
    errors.append(
      "benchmark.recipe_budgets and recipe_budget_extensions must be increasing factors of N beyond "
      f"benchmark.budgets (max {max(b.budgets)}), got {tuple(b.recipe_budgets)} and {tuple(b.recipe_budget_extensions)}"
    )
  if not float(b.recipe_muon_lr) > 0:
    errors.append(f"benchmark.recipe_muon_lr must be > 0, got {b.recipe_muon_lr}")
  fields = set(config_lib.flatten(config))
  unknown = [f for f in kept_fields(config) if f not in fields]
  if unknown:
    errors.append(
      f"--config.benchmark.recipe_keep={b.get('recipe_keep', '')!r} names {unknown}, not fields of the config: "
      "give dotted fields such as model.relu2"
    )
  if errors:
    raise ValueError("; ".join(errors))
  return {
    f"the recipe's step {names[k - 1]!r} (with {names[: k - 1]} before it)": apply_tricks(config, names[:k])
    for k in range(1, len(names) + 1)
  }
