"""The speedrun recipe trick by trick against the ladder's R4 anchor (docs/recipe.md): its tricks
(`bench.speedrun`) added one at a time, each cumulative step tuned with the anchor's LR sweep, run N
steps on each headline seed, and read as a speed-up on the anchor's averaged budget curve (extended
past 2N by `benchmark.recipe.budgets`, then `recipe.budget_extensions` while a step lies below it),
with its wall-clock ratio (interleaved timing) and its paired verdict against the step before. When
the plateau rule fires, every step and the anchor add `benchmark.plateau_seeds`. A trick that does not
help is reported as it measured; none is dropped.
"""

from __future__ import annotations

import json
from typing import Any

from hybridjax.bench import figures, specs, timing, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.speedrun import TRICK_LIST_VERSION, TRICKS, apply_tricks, kept_changes, tricks_of, uses_muon
from hybridjax.bench.studies import Config, Record, Study, copied
from hybridjax.bench.studies.recipe import config as recipe_config
from hybridjax.bench.studies.recipe.figures import anchor_curves, below_curve, recipe_figures
from hybridjax.bench.studies.recipe.report import kept_text, save_recipe_plot
from hybridjax.bench.studies.recipe.report import recipe_markdown as markdown


def anchor_config(config: Config, extra: list[float]) -> Config:
  """The R4 anchor's config: the protocol's AdamW-cosine family with its budget curve extended."""
  budgets = tuple(sorted({float(f) for f in config.benchmark.budgets} | set(extra)))
  return copied(config, {"benchmark.budgets": budgets, "benchmark.methods": ""})


def step_configs(config: Config, anchor_lr: float) -> dict[str, Config]:
  """Each cumulative step's benchmark config, its sweep centred on the anchor's tuned LR (AdamW) or
  on `benchmark.recipe.muon_lr` (Muon)."""
  names = tricks_of(config)
  out = {name: apply_tricks(config, names[: k + 1]) for k, name in enumerate(names)}
  for c in out.values():
    c.optim.learning_rate = float(config.benchmark.recipe.muon_lr) if uses_muon(c) else float(anchor_lr)
    c.benchmark.methods = ""
  return out


def anchor_plateaus(curves: Record, n: int, margin: float) -> list[Record]:
  """The anchor's N-step runs (`tuning.budget_curves`' runs) that sit on an early plateau."""
  at_n = {key.split("/")[0]: r["curve"] for key, r in curves["runs"].items() if r["steps"] == n}
  return figures.plateau_runs({"anchor": at_n}, n, margin)


def header(config: Config, workdir: str) -> list[str]:
  b = config.benchmark
  return [f"recipe {b.preset}: tricks {b.recipe.tricks}, N={int(config.trainer.steps)}; workdir {workdir}"] + [
    f"  step {name}: kept as given (benchmark.recipe.keep): {kept_text(fields)}"
    for name, fields in kept_changes(config).items()
  ]


def train(config: Config, runner: Runner) -> Record:
  """The anchor (tuned, its budget curve) and every cumulative step; with the plateau seeds, when the
  rule fires, and the anchor's curve extended while a step lies below it. Every run goes through the
  runner's cache: an interrupted recipe resumes, and the R4 anchor's runs are the ladder's."""
  b = config.benchmark
  n = int(config.trainer.steps)
  extra = [float(f) for f in b.recipe.budgets]
  acfg = anchor_config(config, extra)

  def with_step_sweeps(lr: float, beta: float) -> list[Record]:
    # The anchor's curve and every step's first sweep grid train together (the steps' sweeps are
    # centred on the anchor's LR, known now); the lockstep sweep below finds them cached.
    first = [
      tuning.spec_of(c)(int(b.tuning_seeds[0]), lr_, n)
      for c in step_configs(config, lr).values()
      for lr_ in tuning.lr_grid(float(c.optim.learning_rate), int(b.lr_points))
    ]
    return tuning.curve_specs(acfg, lambda f: lr, beta) + first

  tuned = tuning.tune(acfg, runner, also=with_step_sweeps)

  def anchor_and_steps(config: Config) -> tuple[Any, ...]:  # on its headline seeds
    acfg, configs = anchor_config(config, extra), step_configs(config, tuned["best_lr"])
    return acfg, tuning.budget_curves(acfg, runner, tuned), configs, tuning.train_steps(configs, config, runner)

  acfg, curves, configs, steps = anchor_and_steps(config)
  flagged = anchor_plateaus(curves, n, float(b.plateau_margin)) + [p for st in steps.values() for p in st["plateaus"]]
  seeds, added = specs.plateau_extension(config)
  if flagged and added:
    print(f"--- plateau runs {flagged}; adding seeds {added} to every step and the anchor", flush=True)
    config = copied(config, {"benchmark.seeds": tuple(seeds + added)})  # the runs trained stay cached
    acfg, curves, configs, steps = anchor_and_steps(config)
  plateaus = {"runs": flagged, "seeds_added": added if flagged else []}
  if plateaus["seeds_added"]:  # the rule read again over every seed (each step's own: its `plateaus`)
    plateaus["anchor_after"] = anchor_plateaus(curves, n, float(b.plateau_margin))
  for factor in b.recipe.budget_extensions:
    if not below_curve(steps, anchor_curves(curves)):
      break
    print(f"--- a step's loss lies below the anchor's curve; extending it to {factor} N", flush=True)
    extra.append(float(factor))
    acfg = anchor_config(config, extra)
    curves = tuning.budget_curves(acfg, runner, tuned | {"per_budget_lr": _per_budget_lr(tuned, acfg)})
  return {
    "config": config,
    "anchor": acfg,
    "tuned": tuned,
    "curves": curves,
    "configs": configs,
    "steps": steps,
    "plateaus": plateaus,
  }


def time_steps(config: Config, trained: Record) -> Record:
  """The anchor's and every step's time per step, interleaved."""
  tuned, configs, steps = trained["tuned"], trained["configs"], trained["steps"]
  entries = {"anchor": (trained["anchor"], tuned["best_lr"], tuned["averaging_beta"])}
  entries |= {name: (configs[name], steps[name]["lr"], steps[name]["beta"]) for name in steps}
  return timing.time_baselines(entries)


def record(config: Config, trained: Record, timed: Record, command: str, runner: Runner) -> Record:
  """recipe.json's record (after the header): the anchor, every step's runs and figures."""
  config = trained["config"]  # with the plateau seeds, where they were added
  n = int(config.trainer.steps)
  acfg, tuned, curves, steps, plateaus = (trained[k] for k in ("anchor", "tuned", "curves", "steps", "plateaus"))
  anchor = anchor_curves(curves)
  result: Record = {
    "code_version": keys.code_versions(config, []),
    "config": json.loads(config.to_json()),  # with the plateau seeds (the header holds the config as given)
    "steps": n,  # the figures below read it from the record
    "trick_list": TRICK_LIST_VERSION,
    "tricks": tricks_of(config),
    "records": {name: TRICKS[name].record for name in tricks_of(config)},
    "adapted": {name: TRICKS[name].adapted for name in tricks_of(config) if TRICKS[name].adapted},
    "kept": kept_changes(config),
    "anchor": {
      "lr": tuned["best_lr"],
      "beta": tuned["averaging_beta"],
      "grid": tuned["grid"],
      "per_budget_lr": _per_budget_lr(tuned, acfg),
      "budgets": curves["budgets"],
      "curves": anchor,
      "at_n": {s: c["loss"][c["steps"].index(n)] for s, c in anchor.items()},
      "eval": figures.eval_errors(curves["runs"], sorted(anchor, key=int), curves["budgets"], n),
    },
    "step_runs": steps,
    "plateaus": plateaus,
    "timing": timed,
  }
  return result | recipe_figures(result)


def _per_budget_lr(tuned: Record, acfg: Config) -> dict[str, float]:
  """The anchor's LR per budget, the budgets past 2N taking the 2N check's (as `tune` gives 1.5N+)."""
  base = tuned["per_budget_lr"]
  beyond = base.get("2.0", tuned["best_lr"])
  return {str(float(f)): base.get(str(float(f)), beyond) for f in acfg.benchmark.budgets}


STUDY = Study(header, train, record, markdown, recipe_config.RECORD, time_steps=time_steps, plot=save_recipe_plot)
