"""The ladder's block of the benchmark config (`benchmark.ladder`) and its checks, the publish folder's
among them (`check_publish`: a ladder joins a published one of the same config only)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from hybridjax import schema
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import record, specs
from hybridjax.bench.studies import Config, Record
from hybridjax.bench.studies.family import config as family_config
from hybridjax.bench.studies.ladder.rungs import (
  CONSTANT_GROUPS,
  RUNGS,
  TUNED_GROUPS,
  arms_at,
  group_config,
  groups_of,
  names,
  rungs_of,
)

RECORD = "ladder-{preset}.json"  # its record, whose invocations a resumed ladder extends
# What two ladders of one measurement may differ in, besides the runtime fields: the rungs each ran,
# and the blocks of the studies the ladder does not read.
JOIN_IGNORES = ("benchmark.ladder.rungs", *record.other_studies("ladder"))


F = schema.Field
FIELDS = (
  F("rungs", ",".join(RUNGS), schema.check_str, "the rungs it runs, comma-separated (`rungs.RUNGS`)"),
  F(
    "methods",
    "",
    schema.check_str,
    "the arms it runs at every rung, of `benchmark.arms` (the preset sets them where it sets the arms)",
  ),
  F("cosine_methods", "", schema.check_str, "the arms it runs at the tuned rungs R3-R6 only, of `benchmark.arms`"),
  F(
    "untuned_lr",
    1e-3,
    schema.check_num(0.0, lo_open=True),
    "the first Adam LR a user would try; R0/R1 hold it constant, R2's sweep starts at it",
  ),
  F("constant_eval_points", 20, schema.check_int(4), "evals over a constant LR's 2N run: its budget curve"),
)
"""The ladder's fields (`benchmark.ladder`), besides `muon`, R5's optimizer block (its keys are `optim` fields)."""
del F


def trained_arms(config: Config) -> tuple[list[str], str]:
  """The arms the ladder trains at its rungs (`rungs.arms_at`), and the fields that name them."""
  arms = [a for g in sorted(groups_of(config)) for a in arms_at(config, g)]
  return arms, "--config.benchmark.ladder.methods (every rung) or --config.benchmark.methods (the tuned rungs)"


def add_defaults(block: Config, preset: str) -> None:
  """The ladder's block besides `FIELDS`: `muon`, R5's optimizer block (its keys are `optim` fields) at
  `preset`. The ladder runs every arm from a claim's own conditions (R0: equal steps, untuned constant LR) up
  to the tuned, averaged baselines (R4-R6)."""
  block.muon = Config({"name": "muon", "learning_rate": 0.02 if preset != "124m" else 0.01})  # R5


def reads(config: Config) -> set[str]:
  """The experiment fields the benchmark otherwise sets per run that this ladder reads: its constant
  rungs (R0-R2's groups, `CONSTANT_GROUPS`) train at `trainer.averaging_beta`, untuned."""
  return {"trainer.averaging_beta"} if groups_of(config) & set(CONSTANT_GROUPS) else set()


def unused_field_errors(config: Config, given: Iterable[str]) -> list[str]:
  """A line for `benchmark.methods` set (in `given`, the fields the command line set) where no
  selected rung runs it: the ladder runs the protocol's arms at its tuned rungs only (`TUNED_GROUPS`)."""
  b = config.benchmark
  tuned = [n for n, r in RUNGS.items() if r.group in TUNED_GROUPS]
  selected = rungs_of(config)
  if "benchmark.methods" not in given or not selected or set(selected) & set(tuned):
    return []
  return [
    f"--config.benchmark.methods={b.methods!r} is set but unused: the ladder runs --config.benchmark.methods "
    f"only at its tuned rungs {','.join(tuned)}, and --config.benchmark.ladder.rungs={b.ladder.rungs!r} "
    f"has none: name the arms in --config.benchmark.ladder.methods (run at every rung), or add a rung from "
    f"{','.join(tuned)}"
  ]


def validate(config: Config) -> dict[str, Config]:
  """Checks the ladder's fields; errors name the field and the fix. It trains no other config that
  needs a check of its own (its groups' are the config's with a schedule or an optimizer changed)."""
  ladder = config.benchmark.ladder
  errors = []
  if not rungs_of(config) or set(rungs_of(config)) - set(RUNGS):
    errors.append(f"--config.benchmark.ladder.rungs={ladder.rungs!r}: give rungs from {','.join(RUNGS)}")
  defined = arms_lib.arms(config)
  for field in ("methods", "cosine_methods"):
    unknown = [m for m in names(ladder[field]) if m not in defined]
    if unknown:
      errors.append(
        f"--config.benchmark.ladder.{field} names {unknown}, not arms of benchmark.arms ({','.join(defined)})"
      )
  specs.refuse(errors)
  check_publish(config)
  return {}


def join_problem(
  earlier: Record,
  config: Config | Record,
  rung_names: list[str],
  groups: Iterable[str],
) -> tuple[str, list[str]]:
  """('', []) where a ladder of `config` that ran `rung_names` (the runs of `groups`) joins the ladder
  record `earlier`; else (why not, the config's differences): another config (`record.config_differences`
  outside `JOIN_IGNORES`: another model, data, seeds, eval set, steps...) would put two measurements in
  one table, and a rung or group both ran would be measured twice."""
  lines = record.config_differences(record.stored_config(earlier), config, JOIN_IGNORES)
  if lines:
    return "a ladder of another config", lines
  shared = set(earlier["rung_names"]) & set(rung_names) | set(earlier["groups"]) & set(groups)
  if shared:
    return f"a ladder that ran {sorted(shared)} already", []
  return "", []


def published_ladder(folder: str, preset: str, config: Config | Record, rung_names: list[str], groups) -> Record:
  """The ladder of `preset` published in `folder` ({} where none), refused (ValueError naming
  --config.benchmark.publish, `record.publish_refusal`) where a ladder of `config` that ran `rung_names`
  (the runs of `groups`) would not join it (`join_problem`)."""
  path = os.path.join(folder, RECORD.format(preset=preset))
  earlier = record.stored(path)
  why, lines = join_problem(earlier, config, rung_names, groups) if earlier else ("", [])
  if why:
    raise ValueError(record.publish_refusal(folder, path, why, lines))
  return earlier


def family_folder(publish: str, preset: str, family: str) -> str:
  """Where a ladder published into `publish` publishes a tuned group's family: beside it, as
  `<preset>-<family>`."""
  return os.path.join(os.path.dirname(os.path.normpath(publish)), f"{preset}-{family}")


def check_publish(config: Config) -> None:
  """Refuses (ValueError naming --config.benchmark.publish) a publish folder whose ladder of the preset
  this one would not join (`join_problem`), or beside which a tuned group's family folder holds
  another config's family (`family_config.check_publish`; its headline seeds may be the plateau
  rule's extension of these)."""
  b = config.benchmark
  folder = str(b.publish)
  if not folder:
    return
  groups = groups_of(config)
  published_ladder(folder, str(b.preset), config, rungs_of(config), groups)
  seeds, added = specs.plateau_extension(config)
  extended = seeds + added
  for group in [g for g in TUNED_GROUPS if g in groups]:
    family = specs.family_name(group_config(config, group, seeds))
    target = family_folder(folder, str(b.preset), family)
    held = record.stored(os.path.join(target, "benchmark.json")).get("seeds")
    family_config.check_publish(group_config(config, group, extended if held == extended else seeds), target)
