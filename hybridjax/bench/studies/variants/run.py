"""The variants study: before/after pairs of the speedrun recipe (`sets.SETS`), each side run N steps
on the headline seeds, read as a paired difference at N. A fixed set runs each side at the LR,
averaging beta and iterate the recipe tuned for its row (the change's effect at that LR); a tuned set
tunes each side as the recipe tunes a step (the change's effect with both sides tuned alike). No
timing: a pair's figure is a loss difference, not a speed-up.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from hybridjax.bench import comparison, specs, tuning
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies import FINALS, Config, Record, Study, copied, kept
from hybridjax.bench.studies.variants import config as variants_config
from hybridjax.bench.studies.variants.config import pairs_of, row_settings, set_of, side_config
from hybridjax.bench.studies.variants.report import markdown as markdown  # the skeleton's hook
from hybridjax.bench.studies.variants.sets import Pair


def header(config: Config, workdir: str) -> list[str]:
  b = config.benchmark
  names = ", ".join(p.name for p in pairs_of(config))
  return [f"variants {b.preset}: set {b.variants.set} ({names}), N={int(config.trainer.steps)}; workdir {workdir}"]


def _side_key(config: Config, pair: Pair, side: str) -> str:
  """What makes a side: its row, the tricks it drops, its fields and the row its LR comes from."""
  return json.dumps(
    [pair.row, sorted(pair.dropped(side)), sorted(pair.fields(side, config).items()), pair.lr_row(side)]
  )


def _sides(config: Config, rows: dict[str, Record]) -> dict[str, tuple[Any, ...]]:
  """Every distinct side of the set's pairs (a side two pairs share trains once): its config and the
  row whose tuned settings it starts from."""
  sides = {}
  for pair in pairs_of(config):
    for side in ("before", "after"):
      sides.setdefault(_side_key(config, pair, side), (side_config(config, pair, side), rows[pair.lr_row(side)]))
  return sides


def _fixed(config: Config, sides: dict[str, tuple[Any, ...]], runner: Runner) -> Record:
  """Each side N steps on the headline seeds at its row's tuned LR, beta and iterate."""
  n, seeds = int(config.trainer.steps), specs.ints(config.benchmark.seeds)
  run_specs = [
    specs.run_spec(c, kind="anchor", seed=s, lr=row["lr"], steps=n, beta=row["beta"])
    for c, row in sides.values()
    for s in seeds
  ]
  results = iter(runner.run(run_specs, "variant pairs (headline seeds, N)"))
  return {
    key: {
      "settings": {x: row[x] for x in ("lr", "beta", "iterate", "from")},
      "runs": {str(r["seed"]): kept(r, (*FINALS, "key")) for r in [next(results) for _ in seeds]},
    }
    for key, (_, row) in sides.items()
  }


def _tuned(config: Config, sides: dict[str, tuple[Any, ...]], runner: Runner) -> Record:
  """Each side tuned as a recipe step is (`tuning.train_steps`), its sweep centred on its row's
  tuned LR, then N steps on the headline seeds (`config`'s) at its best LR."""
  points = int(config.benchmark.variants.lr_points)
  configs = {
    key: copied(c, {"optim.learning_rate": float(row["lr"]), "benchmark.lr_points": points})
    for key, (c, row) in sides.items()
  }
  steps = tuning.train_steps(configs, config, runner, "variant sides (headline seeds, N)")
  settings = ("lr", "beta", "iterate", "grid", "sweep_loss", "best_at_edge")
  return {key: {"settings": {x: st[x] for x in settings}, "runs": st["runs"]} for key, st in steps.items()}


def train(config: Config, runner: Runner) -> Record:
  """Every distinct side on every headline seed, at its row's LR or tuned; a tuned set adds the
  plateau seeds to both sides of a pair whose difference lies within twice the table's resolution."""
  source, rows = row_settings(config)
  sides = _sides(config, rows)
  if not set_of(config).tuned:
    return {"source": source, "sides": _fixed(config, sides, runner), "seeds_added": {}}
  trained = _tuned(config, sides, runner)
  table = pair_table(config, trained)
  close = [p["name"] for p in table["pairs"] if abs(p["difference"]["mean"]) < 2 * table["resolution"]]
  seeds, added = specs.plateau_extension(config)
  if close and added:
    print(f"--- pairs within twice the resolution: {close}; adding seeds {added} to both their sides", flush=True)
    more = copied(config, {"benchmark.seeds": tuple(seeds + added)})
    near = {_side_key(config, p, side) for p in pairs_of(config) if p.name in close for side in ("before", "after")}
    trained |= _tuned(more, {k: v for k, v in sides.items() if k in near}, runner)  # their sweeps come cached
  return {"source": source, "sides": trained, "seeds_added": {"pairs": close, "seeds": added if close else []}}


def pair_figures(before: Record, after: Record) -> Record:
  """One pair's losses on the seeds both sides ran and its paired difference (after - before,
  `comparison.paired_reading`). Pure: the tests recompute it from the record."""
  seeds = sorted(set(before["runs"]) & set(after["runs"]), key=int)
  a, b = ([side["runs"][s] for s in seeds] for side in (after, before))
  loss_a, loss_b, difference = comparison.paired_reading(a, after["settings"], b, before["settings"])
  return {"seeds": seeds, "before": loss_b, "after": loss_a, "difference": difference}


def pair_table(config: Config, sides: Record) -> Record:
  """Every pair's figures, and the table's resolution: 2 standard errors of a paired difference
  (the median over the pairs of the standard error each is judged with)."""
  pairs = []
  for pair in pairs_of(config):
    before, after = (sides[_side_key(config, pair, side)] for side in ("before", "after"))
    pairs.append(
      {"name": pair.name, "row": pair.row, "what": pair.what, "rule": pair.rule, "drop": list(pair.drop)}
      | {"before_fields": pair.fields("before", config), "after_fields": pair.fields("after", config)}
      | {"settings": {"before": before["settings"], "after": after["settings"]}}
      | pair_figures(before, after)
      | {"runs": {"before": before["runs"], "after": after["runs"]}}
    )
  return {"pairs": pairs, "resolution": resolution(pairs)}


def resolution(pairs: list[Record]) -> float:
  """A table's resolution: 2 standard errors of a paired difference (the median over its pairs of the
  standard error each is judged with); a pair within twice it gets the plateau seeds."""
  return 2 * statistics.median(p["difference"]["se_total"] for p in pairs)


def record(config: Config, trained: Record, timed: Record, command: str, runner: Runner) -> Record:
  del timed, command, runner
  return {
    "set": str(config.benchmark.variants.set),
    "tuned": set_of(config).tuned,
    **comparison.code_record(config),
    "seeds": specs.ints(config.benchmark.seeds),
    "seeds_added": trained["seeds_added"],
    "lrs_from": trained["source"],
  } | pair_table(config, trained["sides"])


STUDY = Study(header, train, record, markdown, variants_config.RECORD)
