"""The variants study: before/after pairs of the speedrun recipe (`sets.SETS`), each side run N steps
on the headline seeds at the LR, averaging beta and iterate the recipe tuned for the pair's row, and
read as a paired difference at N (no tuning of its own, no timing: a pair differs in one change, at
one LR, so its figure is the change's effect at that LR, not a speed-up).
"""

from __future__ import annotations

import json
import os
from typing import Any

import ml_collections

import hybridjax
from hybridjax.bench import protocol, specs, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.speedrun import TRICKS, trick_list
from hybridjax.bench.studies.variants.config import pairs_of, side_config
from hybridjax.bench.studies.variants.report import markdown
from hybridjax.bench.tasks import task_path

RECORD = "variants-{set}-{preset}.json"  # its record, whose invocations a resumed study extends
PUBLISHED = os.path.join(os.path.dirname(hybridjax.__file__), "..", "docs", "results", "recipe")


def row_settings(config: ml_collections.ConfigDict) -> tuple[str, dict[str, dict[str, Any]]]:
  """(the recipe record read, {row: {lr, beta, iterate, from}}) for every row of the recipe: the
  record's step of the same name, else the step at the same place in its trick list, else its last."""
  path = str(config.benchmark.variants.lrs_from) or os.path.join(PUBLISHED, f"recipe-{config.benchmark.preset}.json")
  if not os.path.exists(path):
    raise ValueError(
      f"no recipe record at {path}: run the recipe at this preset first, or give one with "
      "--config.benchmark.variants.lrs_from"
    )
  with open(path) as f:
    result = json.load(f)
  steps, listed = result["step_runs"], list(trick_list(result))
  out = {}
  for k, row in enumerate(TRICKS):
    source = row if row in steps else (listed[k] if k < len(listed) else listed[-1])
    out[row] = {key: steps[source][key] for key in ("lr", "beta", "iterate")} | {"from": source}
  root = os.path.abspath(os.path.join(PUBLISHED, "..", "..", ".."))
  inside = os.path.abspath(path).startswith(root + os.sep)
  return (os.path.relpath(os.path.abspath(path), root) if inside else path), out


def header(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  b = config.benchmark
  names = ", ".join(p.name for p in pairs_of(config))
  return [f"variants {b.preset}: set {b.variants.set} ({names}), N={int(config.trainer.steps)}; workdir {workdir}"]


def _side_key(pair: Any, side: str) -> str:
  return json.dumps([pair.row, sorted(getattr(pair, side).items())])


def train(config: ml_collections.ConfigDict, runner: Runner) -> dict[str, Any]:
  """Every distinct side on every headline seed (a side two pairs share trains once)."""
  source, rows = row_settings(config)
  n, seeds = int(config.trainer.steps), [int(s) for s in config.benchmark.seeds]
  sides = {}
  for pair in pairs_of(config):
    for side in ("before", "after"):
      sides.setdefault(_side_key(pair, side), (side_config(config, pair, side), rows[pair.row]))
  run_specs = [
    specs.run_spec(c, kind="anchor", seed=s, lr=row["lr"], steps=n, beta=row["beta"])
    for c, row in sides.values()
    for s in seeds
  ]
  results = runner.run(run_specs, "variant pairs (headline seeds, N)")
  runs = {key: results[k * len(seeds) : (k + 1) * len(seeds)] for k, key in enumerate(sides)}
  return {"source": source, "rows": rows, "runs": runs}


def time_steps(config: ml_collections.ConfigDict, trained: dict[str, Any]) -> dict[str, Any]:
  """None: a pair's figure is a loss difference at one LR."""
  del config, trained
  return {}


def iterate_loss(run: dict[str, Any], iterate: str, beta: float) -> float:
  return run["final_raw"] if iterate == "raw" else tuning.averaged_loss(run, beta)


def pair_figures(before: list[dict[str, Any]], after: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
  """One pair's losses per seed and its paired difference (after - before), judged with the eval
  set's paired per-batch standard error (mean over the seeds) besides the seeds'. Pure: the tests
  recompute it from the record."""
  loss_b = [iterate_loss(r, row["iterate"], row["beta"]) for r in before]
  loss_a = [iterate_loss(r, row["iterate"], row["beta"]) for r in after]
  ses = [tuning.paired_batch_se_of(a, b) for a, b in zip(after, before)]
  eval_se = sum(ses) / len(ses) if ses and None not in ses else None
  return {
    "before": loss_b,
    "after": loss_a,
    "difference": protocol.paired_difference(loss_a, loss_b, eval_se),
  }


def record(
  config: ml_collections.ConfigDict, trained: dict[str, Any], timed: dict[str, Any], command: str, runner: Runner
) -> dict[str, Any]:
  del timed, command, runner
  rows, runs = trained["rows"], trained["runs"]
  keep = ("seed", "final_raw", "final_averaged", "final_averaged_per_batch", "key")
  pairs = []
  for pair in pairs_of(config):
    before, after = runs[_side_key(pair, "before")], runs[_side_key(pair, "after")]
    pairs.append(
      {"name": pair.name, "row": pair.row, "what": pair.what, "before_fields": pair.before, "after_fields": pair.after}
      | {"settings": rows[pair.row]}
      | pair_figures(before, after, rows[pair.row])
      | {
        "runs": {
          side: [{k: r[k] for k in keep if k in r} for r in rs] for side, rs in (("before", before), ("after", after))
        }
      }
    )
  return {
    "set": str(config.benchmark.variants.set),
    "code_version": keys.code_versions(config, []),
    "library_versions": keys.library_versions([keys.RUNNER_MODULES["anchor"], task_path(specs.task_name(config))]),
    "seeds": [int(s) for s in config.benchmark.seeds],
    "lrs_from": trained["source"],
    "pairs": pairs,
  }


def write(result: dict[str, Any], trained: dict[str, Any], workdir: str, publish: str) -> None:
  del trained
  name = RECORD.format(**result)
  for folder in [workdir] + ([publish] if publish else []):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
      json.dump(result, f, indent=1)
    with open(os.path.join(folder, name.replace(".json", ".md")), "w") as f:
      f.write(markdown(result) + "\n")
