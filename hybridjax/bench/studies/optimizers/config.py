"""The optimizers study's block, `benchmark.optimizers`, and its checks.

Cell `as_published`: the recipe's AdamW row (`adamw_row`, `rotary` at `long`) and its Muon row (`muon_row`) at
their published settings (the recipe record's LR, averaging beta and iterate), each on its own budget curve,
each budget its own schedule; nothing searched. Cell `both_tuned`: both rows first searched alike by the joint
search (`bench/search.py`, `benchmark.tuner='joint'`) from their published settings, at equal cost. Cell
`small_batch`: cell `both_tuned`'s chosen settings at a smaller batch, at the same tokens; cell `corpus`: on a
second corpus, read without repeats (`carried.py`).
"""

from __future__ import annotations

import ml_collections

from hybridjax import schema
from hybridjax.bench import record as record_lib
from hybridjax.bench import search, specs
from hybridjax.bench.speedrun import TRICKS, apply_tricks, recipe_record, uses_muon
from hybridjax.bench.studies.optimizers import carried

RECORD = "optimizers-{cell[name]}-{preset}.json"  # its record per cell, whose invocations a resumed study extends
PUBLISH_IGNORES = record_lib.other_studies("optimizers")  # the blocks its record compares without
# The cells: each with the cell it is read against (the summary page reads its factor over that cell's,
# `factor.cell_change`) and what it changes from it.
CELLS = {
  "as_published": (None, "both rows at the recipe's published settings, on their own curves"),
  "both_tuned": ("as_published", "both rows searched alike, at equal cost"),
  "small_batch": ("both_tuned", "a smaller batch at the same tokens, the settings converted and checked locally"),
  "corpus": ("both_tuned", "a second corpus read without repeats, each LR checked locally"),
}
CARRIED = ("small_batch", "corpus")  # the cells that carry cell `both_tuned`'s settings (`carried.py`)
# the `benchmark.tuner` each cell reads
CELL_TUNER = {"as_published": "lr", "both_tuned": "joint", "small_batch": "lr", "corpus": "lr"}
TUNERS = ("lr", "joint")  # the tuners this study runs (`specs.TUNERS`)
SEARCH_CONFIGS = 24  # the fewest Sobol points the joint search draws
SIDES = ("adamw", "muon")


F = schema.Field
FIELDS = (
  F("cell", "as_published", schema.check_choice(*CELLS), "the cell: both rows as published, or both searched alike"),
  F("lrs_from", "", schema.check_str, "the recipe record the rows' settings come from ('': the published "
    "recipe-<preset>.json)"),
  F("adamw_row", "rotary", schema.check_choice(*TRICKS), "the recipe's AdamW row (a step before its Muon row)"),
  F("muon_row", "muon", schema.check_choice(*TRICKS), "the recipe's Muon row"),
  F("seeds", (21, 22, 23, 24, 25), schema.check_int_tuple(0), "the headline seeds (no published record has "
    "read them)"),
  F("plateau_seeds", (26, 27), schema.check_int_tuple(0), "the headline seeds the plateau rule adds"),
  F("tuning_seeds", (1001, 1002, 1003), schema.check_int_tuple(0), "the per-budget re-checks' seeds (at least "
    "two: a setting moves only where it wins beyond their paired noise, `tuning.BUDGET_RULE`)"),
  F("adamw_budgets", (0.75, 1.0, 1.5, 2.0, 2.5, 3.0), schema.check_num_tuple(0.0), "AdamW's budgets (x N)"),
  F("adamw_extensions", (4.0, 6.0), schema.check_num_tuple(0.0), "added in turn until below Muon's loss at N"),
  F("muon_budgets", (0.33, 0.5, 0.75, 1.0), schema.check_num_tuple(0.0), "Muon's budgets (x N)"),
  F("muon_extensions", (0.25, 0.2), schema.check_num_tuple(0.0), "added in turn until it reaches AdamW's at N"),
  F("wide_eval", 8, schema.check_int(0), "every headline run ends with an eval on this many times the eval windows "
    "(0: none)"),
  F("draws", 2000, schema.check_int(100), "the factor's bootstrap draws"),
  F("bootstrap_seed", 0, schema.check_int(0), "the bootstrap's seed"),
  F("search_configs", SEARCH_CONFIGS, schema.check_int(SEARCH_CONFIGS), "cell `both_tuned`: the Sobol points the "
    "joint search draws (`bench/search.py`; besides the published setting)"),
  F("sobol_seed", 0, schema.check_int(0), "cell `both_tuned`: the Sobol sequence's scrambling seed"),
  F("search_space", "v1", schema.check_choice(*search.SPACES), "cell `both_tuned`: the joint search's space "
    "(`search.SPACES`): 'v1', the published cell's (AdamW's embedding LR ratio three-valued), or 'symmetric'"),
  F("search_seeds", (1001, 1002, 1003), schema.check_int_tuple(0), "cell `both_tuned`: the search's seeds (two "
    "for every point, the third for the finalists)"),
  F("spare_seed", 1004, schema.check_int(0), "cell `both_tuned`: the seed a stalled search run is re-run on"),
  F("batch_size", 3, schema.check_int(1), "cell `small_batch`: its windows per step, below the preset's (the "
    "token budgets stay the preset's)"),
  F("settings_from", "", schema.check_str, "cells `small_batch` and `corpus`: the cell `both_tuned` record whose "
    "chosen settings they carry ('': the published optimizers-both_tuned-<preset>.json)"),
  F("corpus_path", "~/.cache/hybridjax/corpora/english-npm", schema.check_str, "cell `corpus`: the corpus folder "
    "(train/ and val/) that `python scripts/build_corpus.py --out <it>` builds"),
)  # fmt: skip
del F
# The fields only some cells read: one set away from its default for another cell is refused (it would do
# nothing without a word).
READ_ONLY_BY = {
  **{k: ("both_tuned",) for k in ("search_configs", "sobol_seed", "search_space", "search_seeds", "spare_seed")},
  "batch_size": ("small_batch",),
  "settings_from": CARRIED,
  "corpus_path": ("corpus",),
}


def _unread_errors(o: ml_collections.ConfigDict) -> list[str]:
  defaults = schema.block(FIELDS)
  return [
    f"--config.benchmark.optimizers.{k}={o[k]!r} has no effect: cell {o.cell!r} does not read it (only "
    f"{', '.join(repr(c) for c in cells)}); set --config.benchmark.optimizers.cell, or leave it at {defaults[k]!r}"
    for k, cells in READ_ONLY_BY.items()
    if str(o.cell) not in cells and record_lib.plain(o[k]) != record_lib.plain(defaults[k])
  ]


def add_defaults(block: ml_collections.ConfigDict, preset: str) -> None:
  """`benchmark.optimizers` at `preset`: `FIELDS`' defaults are `long`'s and every larger preset's; `quick`
  runs a shorter curve of the quick recipe's rows (its AdamW row before Muon is `schedule`)."""
  if preset == "quick":
    block.update(adamw_row="schedule", seeds=(21, 22), plateau_seeds=(23,), adamw_budgets=(0.75, 1.0, 2.0, 3.0))
    block.update(adamw_extensions=(4.0,), muon_budgets=(0.5, 1.0), muon_extensions=(0.25,))


def block_of(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  return config.benchmark.optimizers


def side_configs(config: ml_collections.ConfigDict) -> tuple[str, dict[str, tuple[ml_collections.ConfigDict, dict]]]:
  """(the recipe record read, {side: (its config, its published settings: row, lr, beta, iterate,
  weight_decay)}): each side is the record's cumulative row, at the LR, beta and iterate the record tuned."""
  b, o = config.benchmark, block_of(config)
  field = "benchmark.optimizers.lrs_from"
  shown, result = recipe_record(str(b.preset), str(o.lrs_from), field)
  names, steps = list(result["tricks"]), result["step_runs"]
  out = {}
  for side, row in (("adamw", str(o.adamw_row)), ("muon", str(o.muon_row))):
    if row not in names or row not in steps:
      raise ValueError(
        f"{shown} holds no {row!r} step (it ran {names}): set --config.benchmark.optimizers.{side}_row to one of "
        f"its steps, or give a record that has it with --config.{field}"
      )
    c = apply_tricks(config, names[: names.index(row) + 1])
    settings = {"row": row} | {k: steps[row][k] for k in ("lr", "beta", "iterate")}
    c.optim.learning_rate = float(settings["lr"])
    c.benchmark.methods = ""
    settings["weight_decay"] = search.weight_decay_of(c)[1]
    out[side] = (c, settings)
  return shown, out


def _seed_errors(o: ml_collections.ConfigDict, seeds: list[int], plateau: list[int], tuning: list[int]) -> list[str]:
  """The block's seeds: the search's, the headline's, the plateau's, the tuning's."""
  errors = []
  search = [int(s) for s in o.search_seeds] + [int(o.spare_seed)]
  if len(search) != 4 or len(set(search)) != 4 or set(search) & set(seeds + plateau):
    errors.append(
      f"--config.benchmark.optimizers.search_seeds={tuple(o.search_seeds)} and spare_seed={o.spare_seed}: give "
      "three distinct search seeds and a fourth spare one, none a headline or plateau seed (nothing is tuned on "
      "a headline seed)"
    )
  if len(seeds) < 2:
    errors.append(f"--config.benchmark.optimizers.seeds={tuple(seeds)}: the factor pairs at least 2 headline seeds")
  if len(tuning) < 2 or set(tuning) & set(seeds + plateau):
    errors.append(
      f"--config.benchmark.optimizers.tuning_seeds={tuple(tuning)}: give at least two (the budget checks judge by "
      "their paired noise), none a headline or plateau seed (nothing is tuned on a headline seed)"
    )
  if len(set(seeds + plateau)) != len(seeds + plateau):
    errors.append("--config.benchmark.optimizers.plateau_seeds must differ from the headline seeds and each other")
  return errors


def _budget_errors(o: ml_collections.ConfigDict, n: int) -> list[str]:
  """Each side's budgets and extensions at N = `n` steps."""
  errors = []
  for side, ext_order in (("adamw", 1), ("muon", -1)):
    budgets = [float(f) for f in o[f"{side}_budgets"]]
    ext = [float(f) for f in o[f"{side}_extensions"]]
    if 1.0 not in budgets or budgets != sorted(set(budgets)) or min(budgets) <= 0:
      errors.append(
        f"--config.benchmark.optimizers.{side}_budgets={tuple(budgets)}: give increasing factors of N, N (1.0) among "
        "them (both readings are made at N)"
      )
    edge = max(budgets) if ext_order > 0 else min(budgets)
    if ext and (ext != sorted(ext, reverse=ext_order < 0) or any((f - edge) * ext_order <= 0 for f in ext)):
      way = "above the largest" if ext_order > 0 else "below the smallest (and above 0)"
      errors.append(
        f"--config.benchmark.optimizers.{side}_extensions={tuple(ext)}: give factors {way} of its budgets, in the "
        "order they are added"
      )
    if ext_order < 0 and any(f <= 0 for f in ext):
      errors.append(f"--config.benchmark.optimizers.muon_extensions={tuple(ext)}: factors must be > 0")
    steps = [round(f * n) for f in budgets + ext]
    if len(set(steps)) != len(steps) or min(steps, default=1) < 1:
      errors.append(
        f"--config.benchmark.optimizers.{side}_budgets and {side}_extensions give {steps} steps at "
        f"N={n}: each budget must round to its own positive step count"
      )
  return errors


def validate(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Checks the block; returns both sides' configs, which the skeleton checks too."""
  o = block_of(config)
  errors = []
  seeds, plateau, tuning = ([int(s) for s in o[k]] for k in ("seeds", "plateau_seeds", "tuning_seeds"))
  tuner, want = str(config.benchmark.get("tuner", "lr")), CELL_TUNER.get(str(o.cell))
  if want and tuner != want:
    errors.append(
      f"--config.benchmark.tuner={tuner!r}: cell {o.cell!r} reads tuner {want!r} "
      + ("(it searches nothing)" if want == "lr" else "(both sides searched alike)")
      + f"; set --config.benchmark.tuner={want}"
    )
  is_carried = str(o.cell) in CARRIED
  errors += _unread_errors(o) + _seed_errors(o, seeds, plateau, tuning) + _budget_errors(o, int(config.trainer.steps))
  if is_carried and not errors:
    largest = max(float(f) for f in list(o.adamw_budgets) + list(o.adamw_extensions))
    errors += carried.cell_errors(config, largest)
  specs.refuse(errors)
  # the record keeps the config as given (a carried cell's batch and corpus derive from it), so a re-run's
  # publish compares that config, not the cell's
  name = RECORD.format(preset=config.benchmark.preset, cell={"name": str(o.cell)})
  record_lib.check_publish(config, str(config.benchmark.publish), name, PUBLISH_IGNORES)
  if str(config.benchmark.publish) and str(o.cell) == "corpus":
    carried.check_published_corpus(config, str(config.benchmark.publish), name)
  if is_carried:
    _, before = carried.before_record(config)
    config = carried.cell_config(config)
    _, sides = side_configs(config)
    sides = carried.converted_sides(config, sides, before)
  else:
    _, sides = side_configs(config)
  adamw, muon = sides["adamw"][0], sides["muon"][0]
  if uses_muon(adamw) or not uses_muon(muon):
    raise ValueError(
      f"--config.benchmark.optimizers.adamw_row={o.adamw_row!r} and muon_row={o.muon_row!r}: the AdamW row must "
      "train AdamW and the Muon row Muon (a row at or after the recipe's `muon` step)"
    )
  return {f"the optimizers study's {side} side (the recipe's {s['row']!r} row)": c for side, (c, s) in sides.items()}
