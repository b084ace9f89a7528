"""The optimizers study: Muon's factor over AdamW on one architecture, each side on its own budget curve
(`bench.factor`). Cell `as_published`: the recipe's AdamW row and Muon row at their published settings.
Cell `both_tuned`: both rows first searched by the joint search (`bench.search`, on the study's
`search_seeds`, at equal cost), then run at the settings it chose as cell `as_published` runs the published.
Cells `small_batch` and `corpus`: cell `both_tuned`'s chosen settings carried to a smaller batch at the same
tokens or to a second corpus, each side's LR (and at the smaller batch its beta2) checked locally
(`carried`), then run alike.

Per side: its budgets (x N), each its own schedule, on the headline seeds; at every budget but N its LR
and weight decay re-checked on the tuning seeds by `tuning.BUDGET_RULE` (measurement, counted apart from
any search). AdamW's curve is extended (`adamw_extensions`, in turn) until its loss lies below
Muon's loss at N on every seed, Muon's down (`muon_extensions`) until it reaches AdamW's loss at N on every
seed. When the plateau rule flags an N-step run, both sides add the plateau seeds. Nothing is read beyond
the budgets run.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from hybridjax import codehash
from hybridjax import data as data_lib
from hybridjax.bench import figures, search, specs, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies.optimizers import carried
from hybridjax.bench.studies.optimizers import config as optimizers_config
from hybridjax.bench.studies.optimizers.config import block_of, side_configs
from hybridjax.bench.studies.optimizers.figures import READINGS, cell_figures, loss_of
from hybridjax.bench.studies.optimizers.report import markdown as markdown  # the skeleton's hook
from hybridjax.bench.tasks import task_path

# its record (a resumed study extends its invocations) and the blocks it compares without
RECORD = optimizers_config.RECORD


def header(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  o = block_of(config)
  c = carried.cell_config(config) if str(o.cell) in optimizers_config.CARRIED else config
  corpus = f", corpus {c.data.path} ({c.data.order})" if str(o.cell) == "corpus" else ""
  return [
    f"optimizers {config.benchmark.preset}: cell {o.cell}, rows {o.adamw_row} (AdamW) and {o.muon_row} (Muon), "
    f"N={int(c.trainer.steps)} steps of {int(c.trainer.batch_size)} windows{corpus}, headline seeds "
    f"{tuple(o.seeds)}; workdir {workdir}"
  ]


def _spec(
  c: ml_collections.ConfigDict,
  settings: dict[str, Any],
  at: dict[str, float],
  seed: int,
  steps: int,
  wide_eval: int = 0,
) -> dict:
  """An anchor run of `c` at setting `at` (lr, weight_decay), read at the side's beta; `wide_eval`: its
  final eval's windows, as a multiple of the config's (0: none besides its own)."""
  c = search.apply_setting(c, {search.weight_decay_of(c)[0]: float(at["weight_decay"])})
  beta = float(settings["beta"])
  lr = float(at["lr"])
  return specs.run_spec(c, kind="anchor", seed=seed, lr=lr, steps=steps, beta=beta, betas=[beta], wide_eval=wide_eval)


class _Side:
  """One side's state: its config, published settings, budgets, per-budget settings and runs."""

  def __init__(self, name: str, c: ml_collections.ConfigDict, settings: dict[str, Any], budgets: list[float]):
    self.name, self.config, self.settings, self.budgets = name, c, settings, list(budgets)
    self.checks: dict[str, dict[str, Any]] = {}  # str(factor) -> the re-check
    self.runs: dict[str, dict[str, Any]] = {}  # "seed/steps" -> run
    self.search: dict[str, Any] | None = None  # cell `both_tuned`: the joint search's record
    self.local_check: dict[str, Any] | None = None  # cell `small_batch`: its local check's record

  def setting_at(self, factor: float) -> dict[str, float]:
    check = self.checks.get(str(float(factor)))
    return (
      dict(check["chosen"])
      if check
      else {"lr": float(self.settings["lr"]), "weight_decay": self.settings["weight_decay"]}
    )


def _recheck(config: ml_collections.ConfigDict, sides: list[_Side], runner: Runner) -> None:
  """Every budget but N of every side not yet re-checked: each candidate (`tuning.budget_candidates`) on
  the tuning seeds, in one batch; kept by `tuning.BUDGET_RULE`."""
  n, seeds = int(config.trainer.steps), [int(s) for s in block_of(config).tuning_seeds]
  todo = [
    (side, f, at)
    for side in sides
    for f in side.budgets
    if f != 1.0 and str(float(f)) not in side.checks
    for at in tuning.budget_candidates(float(side.settings["lr"]), float(side.settings["weight_decay"]), f)
  ]
  if not todo:
    return
  run_specs = [_spec(side.config, side.settings, at, s, round(f * n)) for side, f, at in todo for s in seeds]
  results = runner.run(run_specs, "optimizers: per-budget re-checks (tuning seeds)")
  for k, (side, f, at) in enumerate(todo):
    runs = results[k * len(seeds) : (k + 1) * len(seeds)]
    check = side.checks.setdefault(str(float(f)), {"steps": round(f * n), "tried": []})
    check["tried"].append(at | {"losses": [loss_of(r, side.settings) for r in runs]})
  for side in sides:
    for check in side.checks.values():
      choice = tuning.budget_choice(check["tried"])
      check["chosen"] = {"lr": choice["lr"], "weight_decay": choice["weight_decay"]}
      check["best_difference"] = choice["best_difference"]


def _curves(config: ml_collections.ConfigDict, sides: list[_Side], seeds: list[int], runner: Runner) -> None:
  """Every side's runs on `seeds` at every budget, at the budget's setting (cached runs are read back)."""
  n = int(config.trainer.steps)
  todo = [(side, s, f) for side in sides for s in seeds for f in side.budgets if f"{s}/{round(f * n)}" not in side.runs]
  if not todo:
    return
  wide = int(block_of(config).wide_eval)
  run_specs = [_spec(side.config, side.settings, side.setting_at(f), s, round(f * n), wide) for side, s, f in todo]
  for (side, s, f), r in zip(todo, runner.run(run_specs, "optimizers: budget curves (headline seeds)")):
    side.runs[f"{s}/{round(f * n)}"] = r


def _at(side: _Side, seed: int, steps: int) -> float:
  return loss_of(side.runs[f"{seed}/{steps}"], side.settings)


def adamw_short(adamw: _Side, muon: _Side, seeds: list[int], n: int) -> bool:
  """Whether AdamW's curve ends above Muon's loss at N on some seed (its best budget does not reach it)."""
  return any(min(_at(adamw, s, round(f * n)) for f in adamw.budgets) >= _at(muon, s, n) for s in seeds)


def muon_short(adamw: _Side, muon: _Side, seeds: list[int], n: int) -> bool:
  """Whether Muon's curve starts below AdamW's loss at N on some seed (its smallest budget already does
  better, so its steps to reach AdamW's loss at N lie below the budgets run)."""
  return any(_at(muon, s, round(min(muon.budgets) * n)) <= _at(adamw, s, n) for s in seeds)


def shortest_budget(config: ml_collections.ConfigDict, side: str) -> int:
  """The steps of `side`'s shortest budget, its extensions included (the search offers only LR warm-ups
  shorter than it)."""
  o = block_of(config)
  factors = [float(f) for f in o[f"{side}_budgets"]] + [float(f) for f in o[f"{side}_extensions"]]
  return round(min(factors) * int(config.trainer.steps))


def searched_sides(
  config: ml_collections.ConfigDict, configs: dict[str, tuple[ml_collections.ConfigDict, dict]], runner: Runner
) -> tuple[dict[str, tuple[ml_collections.ConfigDict, dict]], dict[str, dict[str, Any]]]:
  """Cell `both_tuned`: both sides searched alike from their published settings (`search.search_both`);
  each side's config and settings at the chosen setting (its published ones kept under 'published'),
  and each side's search record."""
  o = block_of(config)
  shortest = {side: shortest_budget(config, side) for side in configs}
  searches = search.side_searches({side: c for side, (c, _) in configs.items()}, o, config, shortest)
  records = search.search_both(searches, int(o.search_configs), runner)
  out = {}
  for side, (c, published) in configs.items():
    chosen = records[side]["chosen"]
    tuned = search.apply_setting(c, chosen["fields"])
    settings = {"row": published["row"], "lr": float(chosen["fields"]["optim.learning_rate"])}
    settings |= {"beta": chosen["beta"], "iterate": chosen["iterate"], "weight_decay": search.weight_decay_of(tuned)[1]}
    out[side] = (tuned, settings | {"published": published, "fields": chosen["fields"]})
  return out, records


def train(config: ml_collections.ConfigDict, runner: Runner) -> dict[str, Any]:
  """Both sides' curves with their re-checks, the plateau seeds where the rule fires, and the extensions
  (cell `both_tuned`: after the joint search)."""
  o = block_of(config)
  records: dict[str, dict[str, Any]] = {}
  checks: dict[str, dict[str, Any]] = {}
  before = None
  if str(o.cell) in optimizers_config.CARRIED:
    before_source, before = carried.before_record(config)
    config = carried.cell_config(config)
  n = int(config.trainer.steps)
  source, configs = side_configs(config)
  if str(o.cell) == "both_tuned":
    configs, records = searched_sides(config, configs, runner)
  if before is not None:
    configs, checks = carried.local_check(config, carried.converted_sides(config, configs, before), runner)
    source = before_source
  adamw = _Side("adamw", *configs["adamw"], [float(f) for f in o.adamw_budgets])
  muon = _Side("muon", *configs["muon"], [float(f) for f in o.muon_budgets])
  sides, seeds = [adamw, muon], [int(s) for s in o.seeds]
  for side in sides:
    side.search, side.local_check = records.get(side.name), checks.get(side.name)
  _recheck(config, sides, runner)
  _curves(config, sides, seeds, runner)
  at_n = {side.name: {str(s): side.runs[f"{s}/{n}"]["curve"] for s in seeds} for side in sides}
  flagged = figures.plateau_runs(at_n, n, float(config.benchmark.plateau_margin))
  added = [int(s) for s in o.plateau_seeds]
  if flagged and added:
    print(f"--- plateau runs {flagged}; adding seeds {added} to both sides", flush=True)
    seeds = seeds + added
    _curves(config, sides, seeds, runner)
  plateaus = {"runs": flagged, "seeds_added": added if flagged else []}
  extended = {"adamw": [], "muon": []}
  for side, extensions, short in ((adamw, o.adamw_extensions, adamw_short), (muon, o.muon_extensions, muon_short)):
    for factor in [float(f) for f in extensions]:
      if not short(adamw, muon, seeds, n):
        break
      print(f"--- {side.name}'s curve does not span the other side's loss at N on every seed; adding {factor} N")
      side.budgets.append(factor)
      extended[side.name].append(factor)
      _recheck(config, sides, runner)
      _curves(config, sides, seeds, runner)
  out = {"source": source, "sides": sides, "seeds": seeds, "plateaus": plateaus, "extended": extended}
  return out | {"config": config, "before": before}


def corpus(config: ml_collections.ConfigDict, largest_steps: int) -> dict[str, Any]:
  """The corpus: its name, its training tokens, how many times the longest run draws them, and its content
  hash (`data.prepare_corpus`'s, over every document), by which another machine's copy is known to be it."""
  if specs.task_name(config) != "gpt2":
    return {"name": specs.task_name(config), "tokens": None, "max_epochs": None}
  prepared = data_lib.prepare_corpus(
    str(config.data.path) or None,
    str(config.data.tokenizer),
    str(config.data.cache_dir) or None,
    float(config.data.val_fraction),
  )
  drawn = largest_steps * int(config.trainer.batch_size) * int(config.model.n_ctx)
  return {
    "name": str(config.data.path) or "shakespeare (bundled)",
    "tokens": prepared.n_train,
    "max_epochs": drawn / prepared.n_train,
    "content_hash": prepared.meta["content_hash"],
  }


def _keep(run: dict[str, Any]) -> dict[str, Any]:
  return {
    k: run[k]
    for k in ("seed", "steps", "lr", "final_raw", "final_averaged", "final_averaged_per_batch", "wide_eval", "key")
    if k in run
  }


def side_record(side: _Side, seeds: list[int], n: int) -> dict[str, Any]:
  """A side's record: its settings, per-budget setting and re-checks, its runs, and its measurement cost
  (the re-checks' runs in N-run equivalents: their steps over N)."""
  recheck_steps = sum(c["steps"] * len(t["losses"]) for c in side.checks.values() for t in c["tried"])
  return {
    "settings": side.settings,
    "budgets": sorted(side.budgets),
    "per_budget": {str(float(f)): side.setting_at(f) for f in sorted(side.budgets)},
    "rechecks": side.checks,
    # the joint search's runs (cell `both_tuned`) or the local check's (`small_batch`), counted apart
    "tuning_runs": (side.search or side.local_check or {}).get("search_runs", 0.0),
    "search": side.search,
    **({"local_check": side.local_check} if side.local_check else {}),
    "measurement_runs": recheck_steps / n,
    "curve_runs": sum(round(f * n) for f in side.budgets) * len(seeds) / n,
    "runs": {
      f"{s}/{round(f * n)}": _keep(side.runs[f"{s}/{round(f * n)}"]) for s in seeds for f in sorted(side.budgets)
    },
  }


def record(
  config: ml_collections.ConfigDict, trained: dict[str, Any], timed: dict[str, Any], command: str, runner: Runner
) -> dict[str, Any]:
  del timed, command, runner
  preset_batch = int(config.trainer.batch_size)
  config = trained["config"]  # the carried cells: at their batch, on their corpus
  o, n = block_of(config), int(config.trainer.steps)
  seeds = trained["seeds"]
  sides = {side.name: side_record(side, seeds, n) for side in trained["sides"]}
  largest = max(round(f * n) for side in trained["sides"] for f in side.budgets)
  result = {
    "code_version": keys.code_versions(config, []),
    "library_versions": codehash.library_versions([keys.RUNNER_MODULES["anchor"], task_path(specs.task_name(config))]),
    "cell": {
      "name": str(o.cell),
      "preset": str(config.benchmark.preset),
      "batch": [int(config.trainer.batch_size), int(config.model.n_ctx)],
      "eval_batches": int(config.trainer.eval_batches),
      # the per-window losses are read in groups of the preset's batch (the same windows at every batch)
      "eval_groups": int(config.trainer.eval_batches) * int(config.trainer.batch_size) // preset_batch,
    },
    "steps": n,
    "lrs_from": trained["source"],
    "seeds": seeds,
    "tuning_seeds": [int(s) for s in o.tuning_seeds],
    "search_seeds": [int(s) for s in o.search_seeds] + [int(o.spare_seed)] if str(o.cell) == "both_tuned" else [],
    "plateaus": trained["plateaus"],
    "extended": trained["extended"],
    "draws": int(o.draws),
    "bootstrap_seed": int(o.bootstrap_seed),
    "readings": READINGS,
    "sides": sides,
    "corpus": corpus(config, largest),
  }
  result |= cell_figures(result)
  if str(o.cell) == "small_batch":
    result["critical_batch"] = carried.critical_batch(result, trained["before"])
  return result
