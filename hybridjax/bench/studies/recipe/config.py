"""The recipe's block of the benchmark config (`benchmark.recipe`) and its checks."""

from __future__ import annotations

from hybridjax import config as config_lib
from hybridjax import schema
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import record as record_lib
from hybridjax.bench import specs
from hybridjax.bench.speedrun import TRICKS, apply_tricks, is_speedrun_family, kept_fields, tricks_of
from hybridjax.bench.studies import Config, ReadBy

RECORD = "recipe-{preset}.json"  # its record, whose invocations a resumed recipe extends


def _read_in(readers: str, *studies: str) -> ReadBy:
  """Read by `studies` (`readers`, in words) and wherever the recipe trains whole: the ladder's R6 and a
  speedrun family (`speedrun.speedrun_config`)."""

  def reads(config: Config) -> bool:
    b = config.benchmark
    name, r6 = str(b.get("study", "family")), "ladder" in b and "R6" in arms_lib.names(b.ladder.rungs)
    return name in studies or (name == "ladder" and r6) or is_speedrun_family(config)

  return ReadBy(f"{readers}, the ladder's R6 and the speedrun family", reads)


def _factors(v: object) -> str | None:
  """A tuple of factors of N (numbers > 0), empty allowed."""
  if not isinstance(v, (tuple, list)) or not all(schema.is_num(x) and x > 0 for x in v):
    return f"must be a tuple of factors of N (numbers > 0), e.g. (6.0, 8.0), got {v!r}"
  return None


RECIPE_ONLY = _read_in("the recipe study", "recipe")
F = schema.Field
FIELDS = (
  F(
    "tricks",
    ",".join(TRICKS),
    schema.check_str,
    "the tricks, cumulative, in the record's order",
    unread=RECIPE_ONLY,
  ),
  F(
    "keep",
    "",
    schema.check_str,
    "fields no trick changes: their values as given win (comma-separated, dotted); the command line's "
    "--config.<field> overrides are added by `python -m experiments.benchmark` (`speedrun.keep_command_line`)",
    unread=_read_in("the recipe, variants, knobs and optimizers studies", "recipe", "variants", "knobs", "optimizers"),
  ),
  F(
    "muon_lr",
    0.02,
    schema.check_num(0.0, lo_open=True),
    "the centre of a Muon step's LR sweep",
    unread=RECIPE_ONLY,
  ),
  F(
    "budgets",
    (3.0, 4.0),
    schema.check_num_tuple(0.0),
    "the R4 anchor's budget curve extended past 2N, to read the speed-ups on",
  ),
  F(
    "budget_extensions",
    (6.0, 8.0),
    _factors,
    "added one at a time while a step's loss lies below the curve",
  ),
)
"""The recipe's fields (`benchmark.recipe`; R6, the whole recipe, reads them too)."""
del F


def add_defaults(block: Config, preset: str) -> None:
  """The recipe's fields at `preset` where they differ from `FIELDS`' defaults (the Muon LR's centre is 0.05
  at 124m)."""
  if preset == "124m":
    block.muon_lr = 0.05


def validate(config: Config) -> dict[str, Config]:
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
  fields = set(config_lib.flatten(config))
  unknown = [f for f in kept_fields(config) if f not in fields]
  if unknown:
    errors.append(
      f"--config.benchmark.recipe.keep={recipe.keep!r} names {unknown}, not fields of the config: "
      "give dotted fields such as model.relu2"
    )
  specs.refuse(errors)
  record_lib.check_study_publish(config, "recipe", RECORD)  # a recipe of another config there would be replaced
  return {
    f"the recipe's step {names[k - 1]!r} (with {names[: k - 1]} before it)": apply_tricks(config, names[:k])
    for k in range(1, len(names) + 1)
  }
