"""The benchmark's studies, each a folder loaded by name (`benchmark.study`) by the skeleton
(`bench.study`): its `config.py` (its block's defaults, `add_defaults`, and its checks) and its
`run.py`, which declares what the skeleton runs as `STUDY` (a `Study`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections

Config = ml_collections.ConfigDict  # a config: an experiment's with its benchmark block, or a block
Record = dict[str, Any]  # a JSON-like record: a run's, a reading's, a study's, as kept and published

# name -> the package of its folder (named here, loaded only by `bench.study`).
STUDIES = {
  name: f"{__name__}.{name}" for name in ("family", "ladder", "recipe", "variants", "knobs", "optimizers", "anchor")
}


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
