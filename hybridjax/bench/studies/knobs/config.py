"""The knobs study's block, `benchmark.knobs`, and its checks."""

from __future__ import annotations

from hybridjax import schema
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import comparison, search, specs
from hybridjax.bench import record as record_lib
from hybridjax.bench.speedrun import TRICK_LIST_VERSION, recipe_record, row_side
from hybridjax.bench.studies import CURVE_FIELDS, SEARCH_FIELDS, Config, budget_fields, copied, lrs_from, scoped, tuner
from hybridjax.bench.studies.knobs import curves
from hybridjax.bench.studies.knobs.sets import SETS, SIDES

RECORD = "{record_stem}-{preset}.json"  # its record, whose invocations a resumed study extends


def _joint_only(config: Config) -> str | None:
  """The `schema.Field.unread` of a field only the joint tuner reads."""
  name = tuner(config)
  return None if name == "joint" else f"tuner {name!r} does not read it (only 'joint'); set --config.benchmark.tuner"


F = schema.Field
FIELDS = (
  F("sides", ",".join(SIDES), schema.check_str, "the sides to tune, comma-separated (`sets.SIDES`)"),
  F("set", "full", schema.check_choice(*SETS), "the knobs the sides search (`sets.SETS`)"),
  lrs_from("whose tuned LRs the sides start from"),
  F("lr_points", 3, schema.check_int(2), "the points of the closing LR sweep"),
  # `benchmark.tuner='joint'`: the joint search (`bench/search.py`) in place of the coordinate search.
  *scoped(SEARCH_FIELDS, "joint"),
  F(
    "search_space",
    "symmetric",
    schema.check_choice(*search.SPACES),
    "joint: the space (`search.SPACES`): 'symmetric' (every side's embedding and head LR ratios continuous), or "
    "'v1' (AdamW's embedding LR ratio three-valued; no untied Muon row)",
  ),
  # The joint tuner's curves, with R4 and the whole recipe among the sides (`curves.py`).
  *scoped(budget_fields("anchor", "recipe", "R4", "the whole recipe") + CURVE_FIELDS, "joint"),
  F("search_from", "", schema.check_str, "joint: a knobs-joint record whose searches this run takes as "
    "they chose instead of searching again ('': search)", unread=_joint_only),
  F("rows_from", "", schema.check_str, "joint: the cell `both_tuned` record whose AdamW and Muon sides "
    "are read on R4's curve ('': the published optimizers-both_tuned-<preset>.json)"),
)  # fmt: skip
"""`benchmark.knobs`'s fields."""
del F


def add_defaults(block: Config, preset: str) -> None:
  """The quick preset's own value of `benchmark.knobs` (beside `FIELDS`' defaults): it searches the 'quick' set."""
  if preset == "quick":
    block.update(
      set="quick",
      anchor_budgets=(0.75, 1.0, 2.0),
      anchor_extensions=(3.0,),
      recipe_budgets=(0.5, 1.0),
      recipe_extensions=(0.25,),
      plateau_seeds=(23,),
    )


def record_stem(config: Config) -> str:
  """Its record's name before the preset: the joint tuner's is its own, beside the coordinate search's."""
  return "knobs-joint" if tuner(config) == "joint" else "knobs"


def sides_of(config: Config) -> list[str]:
  return arms_lib.names(config.benchmark.knobs.sides)


def knobs_of(config: Config) -> dict[str, tuple]:
  """{side: the knobs it searches, in order}, of the search `benchmark.knobs.set` names."""
  return SETS[str(config.benchmark.knobs.set)]


def side_configs(config: Config) -> tuple[str, dict[str, tuple[Config, dict]]]:
  """(the recipe record read, {side: (its config at its starting LR, its tuned settings)}): the
  anchor is the protocol's AdamW family at the record's R4 LR and beta; `muon` the record's tricks
  through its Muon row, `recipe` all of them, each at the LR, beta and iterate the record tuned for
  it. The record must be of today's trick list: the search tunes today's recipe, whose rows an
  earlier list's LRs were not tuned for."""
  shown, result = recipe_record(config, "knobs")
  version = int(result.get("trick_list", 1))
  if version != TRICK_LIST_VERSION:
    raise ValueError(
      f"{shown} was measured with trick list {version}, before today's (list {TRICK_LIST_VERSION}): the knobs "
      "study tunes today's recipe from the LRs its record tuned, so re-measure the recipe at this preset "
      "(--config.benchmark.study=recipe) or give a record of today's list with --config.benchmark.knobs.lrs_from"
    )
  out = {}
  for side in sides_of(config):
    if side == "anchor":
      settings = {"lr": result["anchor"]["lr"], "beta": result["anchor"]["beta"], "iterate": "averaged"}
      out[side] = (copied(config, {"optim.learning_rate": float(settings["lr"]), "benchmark.methods": ""}), settings)
    else:
      fix = (
        f"the {side!r} side starts from it; give a record that has it with --config.benchmark.knobs.lrs_from, or "
        "leave the side out of --config.benchmark.knobs.sides"
      )
      out[side] = row_side(config, shown, result, "muon" if side == "muon" else result["tricks"][-1], fix)
  return shown, out


def validate(config: Config) -> dict[str, Config]:
  """Checks the block; returns every setting the search may try (each side's with one knob moved),
  which the skeleton checks too: a value a side cannot take fails before any training."""
  k = config.benchmark.knobs
  if not sides_of(config) or set(sides_of(config)) - set(SIDES):
    raise ValueError(f"--config.benchmark.knobs.sides={k.sides!r}: give sides from {','.join(SIDES)}")
  seeds = specs.ints(k.search_seeds) + [int(k.spare_seed)]
  joint = tuner(config) == "joint"
  if joint and (len(seeds) != 4 or len(set(seeds)) != 4 or set(seeds) & {int(s) for s in config.benchmark.seeds}):
    raise ValueError(
      f"--config.benchmark.knobs.search_seeds={tuple(k.search_seeds)} and spare_seed={k.spare_seed}: give three "
      "distinct search seeds and a fourth spare one, none a headline seed (nothing is tuned on a headline seed)"
    )
  if "anchor" in sides_of(config) and (config.optim.name != "adamw" or config.optim.schedule != "cosine"):
    raise ValueError(
      f"the knobs study's anchor is R4 (AdamW, cosine), but this config trains {config.optim.name!r} with "
      f"{config.optim.schedule!r}: run it on the preset's AdamW-cosine family (no ,muon or ,wsd variant)"
    )
  sides = side_configs(config)[1]
  if joint:  # every side must have a space the joint search can search (`search.space_of`)
    for side, (c, _) in sides.items():
      try:
        search.space_of(c, int(config.optim.warmup_steps), space=str(k.search_space))
      except ValueError as e:
        raise ValueError(
          f"side {side!r}: {e}; with --config.benchmark.tuner=joint leave it out of --config.benchmark.knobs.sides"
        ) from None
  if joint and str(k.search_from):
    curves.searched_from(config)
  if curves.reads_curves(config):  # the curves' budgets and seeds, and the record whose rows they read
    o, n = curves.block(config), int(config.trainer.steps)
    errors = comparison.seed_errors("knobs", o)
    errors += [e for s, up in zip(curves.PAIR, (True, False)) for e in comparison.budget_errors("knobs", s, o, n, up)]
    specs.refuse(errors)
    curves.rows_record(config)
  out = {}
  for side, (c, _) in sides.items():
    for knob in knobs_of(config)[side]:
      for value in knob.values_at(int(config.trainer.steps)):
        tried = copied(c, knob.changes(value))
        if tried.to_dict() == c.to_dict():
          raise ValueError(
            f"side {side!r}: knob {knob.name}={value!r} is the side's own setting, so trying it would spend "
            "none of the tuning budget the sides share: leave out the override that set it"
          )
        out[f"side {side!r}, {knob.name}={value!r}"] = tried
  # a record of another config published there would be replaced
  record_lib.check_study_publish(config, "knobs", RECORD, record_stem=record_stem(config))
  return out
