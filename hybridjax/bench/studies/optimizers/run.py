"""The optimizers study: Muon's factor over AdamW on one architecture, each side on its own budget curve,
its cells `STUDY_CELLS` (docs/benchmark.md): both rows at the recipe's published settings, both searched
alike by the joint search (`comparison.searched`), or cell `both_tuned`'s settings carried to a smaller
batch or a second corpus (`carried`). Then each side's curve, its budgets re-checked and extended until
each spans the other's loss at N (`comparison.spanned`), read on each side's own curve
(`comparison.own_curves`)."""

from __future__ import annotations

import json
import os

from hybridjax.bench import comparison, specs
from hybridjax.bench.comparison import Side
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.speedrun import RESULTS
from hybridjax.bench.studies import Config, Record, Study, curves_record
from hybridjax.bench.studies.optimizers import carried
from hybridjax.bench.studies.optimizers import sides as sides_lib
from hybridjax.bench.studies.optimizers.config import PUBLISH_IGNORES, RECORD, STUDY_CELLS, cell_sides

FIELD_PATH = os.path.join(RESULTS, "optimizers", "field.json")


def header(config: Config, workdir: str) -> list[str]:
  o = config.benchmark.optimizers
  cell = comparison.cell_of(STUDY_CELLS, o.cell)
  c = cell.condition(config) if cell.condition else config
  corpus = f", corpus {c.data.path} ({c.data.order})" if c.data.to_dict() != config.data.to_dict() else ""
  rows = (
    f"the reference AdamW (row {o.adamw_row}) against {', '.join(sides_lib.names(o))}"
    if o.cell == "sides"
    else f"rows {o.adamw_row} (AdamW) and {o.muon_row} (Muon)"
  )
  return [
    f"optimizers {config.benchmark.preset}: cell {o.cell}, {rows}, "
    f"N={int(c.trainer.steps)} steps of {int(c.trainer.batch_size)} windows{corpus}, headline seeds "
    f"{tuple(o.seeds)}; workdir {workdir}"
  ]


def train(config: Config, runner: Runner) -> Record:
  """Both sides' curves with their re-checks, the plateau seeds where the rule fires, and the extensions
  (cell `both_tuned`: after the joint search; a carried cell: after its local check)."""
  o = config.benchmark.optimizers
  cell, records, checks = comparison.cell_of(STUDY_CELLS, o.cell), {}, {}
  source, config, configs, before = cell_sides(config, cell)
  if cell.carries:
    configs, checks = carried.local_check(config, configs, runner)
  if cell.name == "sides":
    return sides_lib.train(config, configs["adamw"], runner) | {"source": source, "config": config, "before": None}
  if cell.tuner == "joint":
    configs, records = comparison.searched(config, configs, o, runner)
  sides = [
    Side(s, *configs[s], [float(f) for f in o[f"{s}_budgets"]], search=records.get(s), local_check=checks.get(s))
    for s in ("adamw", "muon")
  ]
  spans = comparison.spanned(config, *sides, o, runner, "optimizers")
  return spans | {"source": source, "sides": sides, "config": config, "before": before}


def record(config: Config, trained: Record, timed: Record, command: str, runner: Runner) -> Record:
  del timed, command, runner
  preset_batch = int(config.trainer.batch_size)
  config = trained["config"]  # the carried cells: at their batch, on their corpus
  o, n = config.benchmark.optimizers, int(config.trainer.steps)
  cell = comparison.cell_of(STUDY_CELLS, o.cell)
  batch = int(config.trainer.batch_size)  # the preset's, but in a carried cell `small_batch`
  head = {"name": cell.name, "preset": str(config.benchmark.preset), "batch": [batch, int(config.model.n_ctx)]}
  searched = specs.ints(o.search_seeds) + [int(o.spare_seed)]
  if cell.name == "sides":
    return (
      comparison.code_record(config)
      | {
        "cell": head,
        "steps": n,
        "lrs_from": trained["source"],
        "search_seeds": searched,
      }
      | sides_lib.record(config, trained, field_range())
    )
  largest = max(round(f * n) for side in trained["sides"] for f in side.budgets)
  result = comparison.code_record(config) | {
    "cell": head
    | {
      "eval_batches": int(config.trainer.eval_batches),
      # the per-window losses are read in groups of the preset's batch (the same windows at every batch)
      "eval_groups": int(config.trainer.eval_batches) * batch // preset_batch,
    },
    "lrs_from": trained["source"],
    "search_seeds": searched if cell.tuner == "joint" else [],
    "corpus": comparison.corpus(config, largest),
  }
  result |= curves_record(o, trained, n)
  result |= cell_figures(result)
  if trained["before"] and trained["before"]["cell"]["batch"] != result["cell"]["batch"]:
    result["critical_batch"] = carried.critical_batch(result, trained["before"])
  return result


def field_range() -> tuple[float, float]:
  """The field's range of Muon's factor over a tuned AdamW: the lowest and highest of the rows of
  docs/results/optimizers/field.json marked `in_range`."""
  with open(FIELD_PATH, encoding="utf-8") as f:
    rows = [r for r in json.load(f)["rows"] if r.get("in_range")]
  return min(r["low"] for r in rows), max(r["high"] for r in rows)


def cell_figures(result: Record) -> Record:
  """Muon's factor over AdamW, each on its own curve, with its verdict (`comparison.own_curves`)."""
  return comparison.own_curves(result, "adamw", "muon", field_range())


def markdown(result: Record) -> str:
  """optimizers-<cell>-<preset>.md: the cell, both readings and the verdict, then each side's curve per seed."""
  if result["cell"]["name"] == "sides":
    title = f"Optimizers against the reference AdamW, `{result['cell']['preset']}`"
    return "\n".join(comparison.page_head(title, result) + sides_lib.markdown(result))
  cell, corpus = result["cell"], result["corpus"]
  epochs = (
    "" if corpus.get("max_epochs") is None else f", its longest run drawing {corpus['max_epochs']:.2f}× its tokens"
  )
  out = comparison.page_head(f"Muon over AdamW on one architecture: cell `{cell['name']}`, `{cell['preset']}`", result)
  out += [
    f"N = {result['steps']} steps of {cell['batch'][0]} × {cell['batch'][1]} tokens; headline seeds {result['seeds']}, "
    f"re-checks on {result['tuning_seeds']}"
    + (f", the joint search on {result['search_seeds']}" if result.get("search_seeds") else "")
    + f"; corpus {comparison.corpus_name(corpus)} ({corpus.get('tokens')} training tokens{epochs}"
    + (f", content hash {corpus['content_hash'][:16]}" if corpus.get("content_hash") else "")
    + ").",
    "",
    "Each side on its own budget curve, fitted L = a_s + b (T/N)^-c (one level per seed), read at N inside the "
    "budgets run (a bound outside them). Reading (a): AdamW's steps to reach Muon's loss at N, over N. Reading "
    "(b): N over Muon's steps to reach AdamW's loss at N. Geometric means over the seeds; the wider of the "
    "bootstrap's (seeds and eval windows) and the t-interval's 95% intervals.",
    "",
  ]
  a, b = "(a) AdamW's steps to Muon's loss at N / N", "(b) N / Muon's steps to AdamW's"
  out += comparison.reading_lines(result, a, b)
  out += comparison.search_lines(result) + carried.local_check_lines(result)
  return "\n".join(out + comparison.curve_lines(result))


STUDY = Study(
  header,
  train,
  record,
  markdown,
  RECORD,
  publish_ignores=PUBLISH_IGNORES,
  tuners=tuple({c.tuner: 0 for c in STUDY_CELLS}),
)
