"""The optimizers study's block, `benchmark.optimizers`, its cells (`STUDY_CELLS`, each a `comparison.Cell`)
and its checks."""

from __future__ import annotations

from hybridjax import optim as optim_lib
from hybridjax import schema
from hybridjax.bench import comparison, search, specs
from hybridjax.bench import record as record_lib
from hybridjax.bench.comparison import Cell
from hybridjax.bench.speedrun import TRICKS, recipe_record, row_side, uses_muon
from hybridjax.bench.studies import CURVE_FIELDS, SEARCH_FIELDS, Config, Record, budget_fields, lrs_from, scoped
from hybridjax.bench.studies.optimizers import carried
from hybridjax.bench.studies.optimizers import sides as sides_lib

RECORD = "optimizers-{cell[name]}-{preset}.json"  # its record per cell, whose invocations a resumed study extends
PUBLISH_IGNORES = record_lib.other_studies("optimizers")  # the blocks its record compares without
STUDY_CELLS = (
  Cell("as_published", "both rows at the recipe's published settings, on their own curves"),
  Cell("both_tuned", "both rows searched alike, at equal cost", "as_published", "joint"),
  Cell(
    "small_batch",
    "a smaller batch at the same tokens, the settings converted and checked locally",
    "both_tuned",
    carries=carried.FROM_CELL,
    condition=carried.smaller_batch,
    checks=carried.batch_errors,
  ),
  Cell(
    "corpus",
    "a second corpus read without repeats, each LR checked locally",
    "both_tuned",
    carries=carried.FROM_CELL,
    condition=carried.on_corpus,
    checks=carried.corpus_errors,
  ),
  Cell("sides", "each optimizer of `sides` against the reference AdamW, searched alike at equal cost", tuner="joint"),
)


F = schema.Field
SEARCHED = comparison.only_in("both_tuned", "sides")
FIELDS = (
  F("cell", "as_published", schema.check_choice(*(c.name for c in STUDY_CELLS)), "the cell: both rows as "
    "published, or both searched alike"),
  lrs_from("the rows' settings come from"),
  F("adamw_row", "rotary", schema.check_choice(*TRICKS), "the recipe's AdamW row (a step before its Muon row)"),
  F("muon_row", "muon", schema.check_choice(*TRICKS), "the recipe's Muon row"),
  F("seeds", (21, 22, 23, 24, 25), schema.check_int_tuple(0), "the headline seeds (no published record has "
    "read them)"),
  F("tuning_seeds", (1001, 1002, 1003), schema.check_int_tuple(0), "the per-budget re-checks' seeds (at least "
    "two: a setting moves only where it wins beyond their paired noise, `tuning.BUDGET_RULE`)"),
  *budget_fields("adamw", "muon", "AdamW", "Muon"),
  *CURVE_FIELDS,
  *scoped(SEARCH_FIELDS, "cell `both_tuned`", SEARCHED),
  F("search_space", "v1", schema.check_choice(*search.SPACES), "cell `both_tuned`: the joint search's space "
    "(`search.SPACES`): 'v1', the published cell's (AdamW's embedding LR ratio three-valued), or 'symmetric'",
    unread=SEARCHED),
  F("batch_size", 3, schema.check_int(1), "cell `small_batch`: its windows per step, below the preset's (the "
    "token budgets stay the preset's)", unread=comparison.only_in("small_batch")),
  F("settings_from", "", schema.check_str, "cells `small_batch` and `corpus`: the cell `both_tuned` record whose "
    "chosen settings they carry ('': the published optimizers-both_tuned-<preset>.json)",
    unread=comparison.only_in("small_batch", "corpus")),
  F("sides", "", schema.check_str, "cell `sides`: the optimizers read against the reference AdamW, comma-separated: "
    "built-in names or a module's dotted path (`optimizers.module`)", unread=comparison.only_in("sides")),
  F("reference_from", "", schema.check_str, "cell `sides`: a cell `both_tuned` record whose AdamW side is the "
    "reference, read with its runs from its run cache beside it, never re-run ('': searched again with the sides)",
    unread=comparison.only_in("sides")),
  F("corpus_path", "~/.cache/hybridjax/corpora/english-npm", schema.check_str, "cell `corpus`: the corpus folder "
    "(train/ and val/) that `python scripts/build_corpus.py --out <it>` builds",
    unread=comparison.only_in("corpus")),
)  # fmt: skip
del F


def add_defaults(block: Config, preset: str) -> None:
  """`benchmark.optimizers` at `preset`: `FIELDS`' defaults are `long`'s and every larger preset's; `quick`
  runs a shorter curve of the quick recipe's rows (its AdamW row before Muon is `schedule`)."""
  if preset == "quick":
    block.update(
      adamw_row="schedule",
      seeds=(21, 22),
      plateau_seeds=(23,),
      adamw_budgets=(0.75, 1.0, 2.0, 3.0),
      adamw_extensions=(4.0,),
      muon_budgets=(0.5, 1.0),
      muon_extensions=(0.25,),
    )


def side_configs(config: Config) -> tuple[str, dict[str, tuple[Config, dict]]]:
  """(the recipe record read, {side: (its config, its published settings: row, lr, beta, iterate,
  weight_decay)}): each side is the record's cumulative row, at the LR, beta and iterate the record tuned."""
  o = config.benchmark.optimizers
  shown, result = recipe_record(config, "optimizers")
  out = {}
  for side, row in (("adamw", str(o.adamw_row)), ("muon", str(o.muon_row))):
    fix = (
      f"set --config.benchmark.optimizers.{side}_row to one of its steps, or give a record that has it with "
      "--config.benchmark.optimizers.lrs_from"
    )
    c, settings = row_side(config, shown, result, row, fix)
    out[side] = (c, {"row": row} | settings | {"weight_decay": search.weight_decay_of(c)[1]})
  return shown, out


def cell_sides(config: Config, cell: Cell) -> tuple[str, Config, dict[str, tuple], Record | None]:
  """(the record the rows' settings come from, the cell's config, its sides: `side_configs`, or in a cell that
  carries cell `both_tuned`'s settings those converted to the cell's condition, the cell `both_tuned` record
  they come from: None where the cell carries none)."""
  if not cell.carries:
    source, sides = side_configs(config)
    return source, config, sides, None
  source, before = carried.before_record(config)
  config = cell.condition(config)
  return source, config, carried.converted_sides(config, side_configs(config)[1], before), before


def validate(config: Config) -> dict[str, Config]:
  """Checks the block; returns both sides' configs, which the skeleton checks too."""
  o, n = config.benchmark.optimizers, int(config.trainer.steps)
  cell = comparison.cell_of(STUDY_CELLS, o.cell)
  errors = comparison.tuner_errors(cell, config) + comparison.seed_errors("optimizers", o)
  errors += [
    e for side, up in (("adamw", True), ("muon", False)) for e in comparison.budget_errors("optimizers", side, o, n, up)
  ]
  name = RECORD.format(preset=config.benchmark.preset, cell={"name": cell.name})
  if cell.checks and not errors:
    errors += cell.checks(config, max(float(f) for f in list(o.adamw_budgets) + list(o.adamw_extensions)), name)
  specs.refuse(errors)
  # the record keeps the config as given (a carried cell's batch and corpus derive from it), so a re-run's
  # publish compares that config, not the cell's
  record_lib.check_publish(config, str(config.benchmark.publish), name, PUBLISH_IGNORES)
  _, config, sides, _ = cell_sides(config, cell)
  adamw, muon = sides["adamw"][0], sides["muon"][0]
  if cell.name == "sides":  # the built-in sides' configs are checked as the rows' are
    specs.refuse(sides_lib.errors(config, adamw))
    builtin = [n for n in sides_lib.names(o) if n in optim_lib.OPTIMIZERS]
    sides |= {n: (search.centred(adamw, n), {"row": n}) for n in builtin}
  if uses_muon(adamw) or not uses_muon(muon):
    raise ValueError(
      f"--config.benchmark.optimizers.adamw_row={o.adamw_row!r} and muon_row={o.muon_row!r}: the AdamW row must "
      "train AdamW and the Muon row Muon (a row at or after the recipe's `muon` step)"
    )
  return {f"the optimizers study's {side} side (the recipe's {s['row']!r} row)": c for side, (c, s) in sides.items()}
