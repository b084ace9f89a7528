"""The ladder's rungs as data; each a baseline condition, the group of runs it reads, the iterate it compares."""

from __future__ import annotations

import dataclasses

from hybridjax.bench import arms as arms_lib
from hybridjax.bench import specs, speedrun
from hybridjax.bench.studies import Config


@dataclasses.dataclass(frozen=True)
class Rung:
  name: str
  claim: str  # whose conditions it reproduces
  baseline: str  # the baseline condition
  iterate: str  # 'raw', 'averaged', or 'chosen' (the one the group's tuning chose): compared, arm's and baseline's
  group: str  # the runs it reads: 'untuned', 'constant', 'cosine', 'muon', 'speedrun'


RUNGS = {
  "R0": Rung("R0", "the seed's claim", "equal N steps, untuned LR held constant", "raw", "untuned"),
  "R1": Rung("R1", "NiNo's", "untuned LR held constant, budget curve", "raw", "untuned"),
  "R2": Rung("R2", "", "constant LR, tuned", "raw", "constant"),
  "R3": Rung("R3", "", "tuned LR, cosine, each budget its own schedule", "raw", "cosine"),
  "R4": Rung("R4", "the verdict", "R3 with weight averaging", "averaged", "cosine"),
  "R5": Rung("R5", "the verdict", "Muon, tuned, cosine, averaged", "averaged", "muon"),
  "R6": Rung("R6", "the verdict", "the speedrun recipe, tuned", "chosen", "speedrun"),
}


VERDICT = ("R4", "R5", "R6")
GROUP_ORDER = ("cosine", "untuned", "constant", "muon", "speedrun")  # the verdict's runs first, the costliest last
TUNED_GROUPS = ("cosine", "muon", "speedrun")  # the groups that run the protocol's own tuning and budget curves
CONSTANT_GROUPS = ("untuned", "constant")
WITHIN = 0.02  # the seed's own criterion: a speedup counts at <= 2% final-loss gap
names = arms_lib.names


def rungs_of(config: Config) -> list[str]:
  return names(config.benchmark.ladder.rungs)


def groups_of(config: Config) -> set[str]:
  """The groups whose runs the chosen rungs read (a rung not of `RUNGS` reads none)."""
  return {RUNGS[r].group for r in rungs_of(config) if r in RUNGS}


def arms_at(config: Config, group: str) -> list[str]:
  """The arms a group runs: `ladder.methods` everywhere; at R3-R6 also `ladder.cosine_methods` and
  the protocol's own arms (`benchmark.methods`), so the family results re-written from these runs
  keep every arm the protocol runs."""
  b = config.benchmark
  extra = names(b.ladder.cosine_methods) + names(b.methods) if group in TUNED_GROUPS else []
  return list(dict.fromkeys(names(b.ladder.methods) + extra))


def timing_key(group: str) -> str:
  """The timing a group's arms read: their own for Muon and the speedrun, AdamW's for the rest."""
  return group if group in ("muon", "speedrun") else "adamw"


def group_config(config: Config, group: str, seeds: list[int]) -> Config:
  """The benchmark config whose runs a group trains: constant schedules for R0-R2 (the untuned LR for
  R0/R1), the `benchmark.ladder.muon` overrides for R5, the whole recipe for R6; `seeds` as its headline seeds."""
  c = Config(config.to_dict())
  if group in CONSTANT_GROUPS:
    c.optim.schedule = "cosine"
    c.optim.min_lr_ratio = 1.0  # cosine with its floor at the peak: constant after the warm-up
  if group == "untuned":
    c.optim.learning_rate = float(config.benchmark.ladder.untuned_lr)
  if group == "muon":
    c.update_from_flattened_dict({"optim." + k: v for k, v in config.benchmark.ladder.muon.to_dict().items()})
  if group == "speedrun":
    c = speedrun.speedrun_config(c)
  c.benchmark.seeds = tuple(specs.ints(seeds))
  if group != "speedrun":  # the recipe names its own family
    c.benchmark.family = f"{c.optim.name}-{'constant' if group in CONSTANT_GROUPS else c.optim.schedule}"
  c.benchmark.methods = ",".join(arms_at(config, group))
  return c
