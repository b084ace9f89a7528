"""The benchmark's studies, each a folder loaded by name (`benchmark.study`) by the skeleton
(`bench.study`): its `config.py` (its block's defaults, `add_defaults`, and its checks) and its
`run.py`, which declares what the skeleton runs as `STUDY` (a `Study`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections

from hybridjax import schema

Config = ml_collections.ConfigDict  # a config: an experiment's with its benchmark block, or a block
Record = dict[str, Any]  # a JSON-like record: a run's, a reading's, a study's, as kept and published

# name -> the package of its folder (named here, loaded only by `bench.study`).
STUDIES = {
  name: f"{__name__}.{name}" for name in ("family", "ladder", "recipe", "variants", "knobs", "optimizers", "anchor")
}


F = schema.Field
SEARCH_FIELDS = (
  F("search_configs", 24, schema.check_int(24), "the Sobol points the joint search draws for each side "
    "(`bench/search.py`; besides its published setting)"),
  F("sobol_seed", 0, schema.check_int(0), "the Sobol sequence's scrambling seed"),
  F("search_seeds", (1001, 1002, 1003), schema.check_int_tuple(0), "the search's seeds (two for every point, the "
    "third for the finalists)"),
  F("spare_seed", 1004, schema.check_int(0), "the seed a stalled search run is re-run on"),
)  # fmt: skip
"""The joint search's fields in the block of a study that runs it (its `search_space` is the study's own)."""
CURVE_FIELDS = (
  F("plateau_seeds", (26, 27), schema.check_int_tuple(0), "the headline seeds the plateau rule adds"),
  F("wide_eval", 8, schema.check_int(0), "every curve run ends with an eval on this many times the eval windows "
    "(0: none)"),
  F("draws", 2000, schema.check_int(100), "the factor's bootstrap draws"),
  F("bootstrap_seed", 0, schema.check_int(0), "the bootstrap's seed"),
)  # fmt: skip
"""The budget curves' fields (`curves_record`) in the block of a study that reads two sides on them."""


def lrs_from(what: str) -> schema.Field:
  """`lrs_from`, the recipe record (`speedrun.recipe_record`) `what` comes from."""
  return F("lrs_from", "", schema.check_str, f"the recipe record {what} ('': the published `recipe-<preset>.json`)")


def budget_fields(slow: str, fast: str, slow_name: str, fast_name: str) -> tuple[schema.Field, ...]:
  """The budgets of two sides' curves (`comparison.budget_errors`): `<slow>_budgets` and the
  `<slow>_extensions` added above them, `<fast>_budgets` and the `<fast>_extensions` added below them;
  `slow_name` and `fast_name` are the sides in words."""
  grow = "added to {}'s budgets in turn until its curve {} {}'s loss at N"
  return (
    F(f"{slow}_budgets", (0.75, 1.0, 1.5, 2.0, 2.5, 3.0), schema.check_num_tuple(0.0), f"{slow_name}'s budgets (x N)"),
    F(f"{slow}_extensions", (4.0, 6.0), schema.check_num_tuple(0.0), grow.format(slow_name, "lies below", fast_name)),
    F(f"{fast}_budgets", (0.33, 0.5, 0.75, 1.0), schema.check_num_tuple(0.0), f"{fast_name}'s budgets (x N)"),
    F(f"{fast}_extensions", (0.25, 0.2), schema.check_num_tuple(0.0), grow.format(fast_name, "reaches", slow_name)),
  )


def scoped(
  fields: tuple[schema.Field, ...], scope: str, unread: schema.Unread | None = None
) -> tuple[schema.Field, ...]:
  """`fields` as a block declares those read in its `scope` alone (in words): each doc led by it, each `unread`."""
  return tuple(dataclasses.replace(f, doc=f"{scope}: {f.doc}", unread=unread) for f in fields)


FINALS = ("final_raw", "final_averaged", "final_averaged_per_batch")  # a run's final losses


def kept(run: Record, fields: tuple[str, ...]) -> Record:
  """What a study's record keeps of a run: the `fields` it holds, in their order."""
  return {k: run[k] for k in fields if k in run}


def copied(config: Config, fields: Record | None = None) -> Config:
  """A copy of `config` with `fields` ({dotted field: value}) set."""
  c = Config(config.to_dict())
  c.update_from_flattened_dict(fields or {})
  return c


def tuner(config: Config) -> str:
  """`benchmark.tuner`: 'lr' (the LR sweep) or 'joint' (the joint search, `bench.search`)."""
  return str(config.benchmark.get("tuner", "lr"))


def curves_record(block: Config, spans: Record, n: int) -> Record:
  """Two sides' curves (`comparison.spanned`'s `spans`, with their `comparison.Side`s as `sides`) as
  `comparison.own_curves` reads them, judged by `block`'s re-check seeds and bootstrap. Its `readings`, 2: the
  interpolated readings beside the fitted ones, the verdict against 1.0x (`factor.verdict_against_one`; the
  published records without the field are of 1: against 1.5x, and re-read as published)."""
  seeds = spans["seeds"]
  return {
    "steps": n,
    "seeds": seeds,
    "tuning_seeds": [int(s) for s in block.tuning_seeds],
    "plateaus": spans["plateaus"],
    "extended": spans["extended"],
    "draws": int(block.draws),
    "bootstrap_seed": int(block.bootstrap_seed),
    "readings": 2,
    "sides": {side.name: side.record(seeds, n) for side in spans["sides"]},
  }


@dataclasses.dataclass(frozen=True)
class ReadBy:
  """The `schema.Field.unread` of a field of a study's block that other studies' runs read too, declared
  by its owner: `readers`, in words, and `reads(config)`, whether that config's runs read it. The
  skeleton refuses the field set where they do not (`study.unused_field_errors`); a field declaring
  none is read by its own study alone."""

  readers: str
  reads: Callable[[Any], bool]

  def __call__(self, config: Any) -> str | None:
    return None if self.reads(config) else f"it is read by {self.readers}"


@dataclasses.dataclass(frozen=True)
class Study:
  """What the skeleton runs of a study, its run.py's `STUDY`: every hook a required field, so a study that
  misses or misspells one fails when its run.py is imported, not after hours of training (AlgoPerf's
  spec.py).

  Attributes:
    header: (config, workdir) -> the lines printed first.
    train: (config, runner) -> what it trained.
    record: (config, trained, timed, command, runner) -> its record, below the skeleton's header.
    markdown: (result) -> its page.
    record_name: its json (a format string of the record), whose invocations a resumed study extends;
      None where it keeps none.
    time_steps: (config, trained) -> its timing; None where its verdicts are in steps or losses.
    write: (result, trained, workdir, publish) -> None, its files and the published copy; None: its json,
      page and `plot` (`record.write_and_publish`), not published where `publish` holds another config's
      record, the config compared without the blocks of `publish_ignores` (empty: the other studies').
    plot: (result, folder) -> its figure's path; None where it draws none.
    publish_ignores: see `write`.
    tuners: the `benchmark.tuner` values it reads: 'lr' (the LR sweep, every study's) and 'joint' (the
      joint search, `bench.search`).
  """

  header: Callable[..., list[str]]
  train: Callable[..., Record]
  record: Callable[..., Record]
  markdown: Callable[[Record], str]
  record_name: str | None
  time_steps: Callable[..., Record] | None = None
  write: Callable[..., None] | None = None
  plot: Callable[[Record, str], str] | None = None
  publish_ignores: tuple[str, ...] = ()
  tuners: tuple[str, ...] = ("lr",)
