"""The speedrun recipe, trick by trick: what actually trains GPT-2 faster, measured against R4.

The modded-nanogpt speedrun reaches llm.c's GPT-2 loss with 13.7x fewer tokens through an
architecture, the Muon optimizer and a schedule. This module adds its changes one at a time, in the
order of its record history and grouped as its records grouped them (`TRICKS`), to the ladder's R4
anchor (the tuned, averaged AdamW-cosine GPT-2), and measures each cumulative step:

* every step gets the anchor's LR sweep (`tuning.sweep_lrs`: the same grid size, extensions and
  second-seed check, on the tuning seeds); AdamW steps centre it on the anchor's tuned LR, Muon steps
  on `benchmark.recipe_muon_lr`; the averaging beta and whether the averaged or the raw iterate is
  reported are chosen there too, on the tuning seeds;
* its headline: N steps on each headline seed at the tuned LR;
* its **speed-up**: the R4 anchor's steps to reach the step's final loss, read on the anchor's
  averaged budget curve (paired by seed), over N. The curve is extended past the protocol's 2N by
  `benchmark.recipe_budgets`, and further by `recipe_budget_extensions` while a step's loss lies
  below its end; a loss still below it reads "> x" (a lower bound);
* its wall-clock ratio: the speed-up times the anchor's step time over the step's, both timed
  interleaved in one process, as the ladder times its arms;
* its paired verdict against the previous step (the anchor's N-step runs for the first).

Three headline seeds, and more when the plateau rule fires (`protocol.plateau_runs`: a step's run, or
the anchor's N-step run, far above its seeds' median at N/10 or N): then every step and the anchor's
curve add `benchmark.plateau_seeds`, so each step stays paired with the one before it and read on
the anchor's curve seed by seed.

A trick that does not help is reported as it measured ("no difference", "higher"); none is dropped.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from collections.abc import Callable
from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import figures, protocol, report, specs, timing, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner, make_runner


@dataclasses.dataclass(frozen=True)
class Trick:
  """One step of the recipe: the record that introduced it and the config it changes."""

  name: str  # as the record history names it
  record: str  # the speedrun record(s) it comes from
  changes: Callable[[ml_collections.ConfigDict], dict[str, Any]]  # config -> {"block.field": value}
  # How a record's value is carried over to a smaller model where it is not copied as it stands.
  adapted: str = ""


def _value_embeds(c: ml_collections.ConfigDict) -> dict[str, Any]:
  # The record's 3 tables in 12 layers reach the first 3 and the last 3, half the layers: k =
  # n_layer // 4 tables, at least one, reach 2k layers (at 2 layers the one table reaches both).
  return {"model.value_embeds": max(1, int(c.model.n_layer) // 4)}


# Record #9 warmed Muon's momentum up over its first 500 of 3200 steps; the step keeps that share of
# the run (the records' later 300 of 1393 is a larger one).
MOMENTUM_WARMUP_FRACTION = 500 / 3200
# Record #20's attention scale, 0.12 at head_dim 128: with QK-norm, |q . k| <= head_dim, so the
# scores are bounded by 0.12 * 128 = 15.36, which the step keeps whatever the head dimension.
RECORD_SCORE_BOUND = 0.12 * 128


def _shortcuts(c: ml_collections.ConfigDict) -> dict[str, Any]:
  return {
    "model.embed_skips": True,
    "model.logit_softcap": 15.0,
    "model.value_residual": True,
    "optim.muon_momentum_warmup_steps": max(1, round(MOMENTUM_WARMUP_FRACTION * int(c.trainer.steps))),
    "optim.muon_momentum_start": 0.85,
  }


def _attn_scale(c: ml_collections.ConfigDict) -> dict[str, Any]:
  head_dim = int(c.model.d_model) // int(c.model.n_head)
  return {"model.attn_scale": RECORD_SCORE_BOUND / head_dim, "model.init": "fan_in_0.5"}


TRICKS: dict[str, Trick] = {
  t.name: t
  for t in (
    Trick(
      "schedule",
      "#2 tuned LR: constant, then a linear cool-down over the last 40% to zero",
      lambda c: {"optim.schedule": "wsd", "optim.decay_fraction": 0.4, "optim.min_lr_ratio": 0.0},
    ),
    Trick(
      "rotary",
      "#2-#4 rotary embeddings, RMSNorm without parameters, no biases",
      lambda c: {"model.rotary": True, "model.rmsnorm": True},
    ),
    Trick(
      "muon",
      "#3-#4 Muon on the hidden matrices, AdamW (betas (0.9, 0.95), eps 1e-8) on the tied embedding and head; "
      "no LR warm-up, clipping or weight decay; PyTorch's default init (U(±1/√fan_in); #4's code, #3's is not "
      "published)",
      lambda c: {
        "optim.name": "muon_groups",
        "optim.grad_clip": 0.0,
        "optim.weight_decay": 0.0,
        "optim.warmup_steps": 0,
        "optim.tied_lr_ratio": 0.36,
        "optim.tied_b1": 0.9,
        "optim.tied_b2": 0.95,
        "optim.tied_eps": 1e-8,
        "model.init": "fan_in",
      },
      adapted="the tied matrix's LR 0.0036 over Muon's 0.1 * 0.0036 * √768 (its scale at width 768) = 0.36 of "
      "Muon's rate in optax's units",
    ),
    Trick(
      "modern_arch",
      "#5 ReLU², QK-norm, zero-init projections",
      lambda c: {"model.relu2": True, "model.qk_norm": True, "model.zero_init_proj": True},
    ),
    Trick(
      "untied_head",
      "#8 untied embedding and head (zero-initialised head), RMSNorm after the embedding",
      lambda c: {"model.untied_head": True, "model.embed_norm": True},
    ),
    Trick(
      "shortcuts",
      "#9 embedding skip connections, the value residual, Muon's momentum warm-up from 0.85, logit soft-cap "
      "(at #18's 15)",
      _shortcuts,
      adapted=f"the momentum warm-up over the record's share of the run, {MOMENTUM_WARMUP_FRACTION:.4g} N "
      "(500 of 3200 steps)",
    ),
    Trick("unet", "#11 U-net pattern skip connections", lambda c: {"model.unet_skips": True}),
    Trick(
      "value_embeds",
      "#14-#17 value embeddings in place of the value residual, U-net pattern (first and last layers)",
      lambda c: _value_embeds(c) | {"model.value_residual": False},
      adapted="n_layer // 4 tables (at least one), each into a first and a last layer: the record's 3 tables "
      "reach half of its 12 layers",
    ),
    Trick(
      "attn_scale",
      "#20 attention scale (0.12 at head_dim 128), matrices initialised at std 0.5/√fan_in",
      _attn_scale,
      adapted=f"the scale that keeps the record's bound on the QK-normed scores, {RECORD_SCORE_BOUND:.2f} / "
      "head_dim (0.12 at head_dim 128)",
    ),
  )
}
"""The recipe's steps, cumulative, in the record history's order (docs/recipe.md)."""

TRICKS_V1: dict[str, Trick] = {
  t.name: t
  for t in (
    TRICKS["schedule"],
    TRICKS["rotary"],
    Trick(
      "muon",
      "#3-#4 Muon on the hidden matrices, Adam on embeddings, head and scalars; no clipping or weight decay",
      lambda c: {"optim.name": "muon_groups", "optim.grad_clip": 0.0, "optim.weight_decay": 0.0},
    ),
    Trick(
      "modern_arch",
      "#5 ReLU², QK-norm, zero-init projections, the normalised embedding",
      lambda c: {"model.relu2": True, "model.qk_norm": True, "model.zero_init_proj": True, "model.embed_norm": True},
    ),
    Trick("untied_head", "#8 untied embedding and head (zero-initialised head)", lambda c: {"model.untied_head": True}),
    Trick(
      "embed_skips",
      "#9 embedding skip connections, logit soft-cap (at #18's 15)",
      lambda c: {"model.embed_skips": True, "model.logit_softcap": 15.0},
    ),
    TRICKS["unet"],
    Trick("value_embeds", "#14-#15 value embeddings, U-net pattern (first and last layers)", _value_embeds),
  )
}
"""The first trick list, which the published recipe-long.json and recipe-tiny.json were measured with
(they hold no `trick_list`): GPT-2's init throughout, the embedding norm in the #5 group, the tied head
at the untied head's Adam settings, the LR warm-up in every step, no value residual, momentum warm-up
or attention scale. Kept to read those records as what they are; `TRICKS` is what runs."""

TRICK_LIST_VERSION = 2
TRICK_LISTS = {1: TRICKS_V1, TRICK_LIST_VERSION: TRICKS}


def trick_list(result: dict[str, Any]) -> dict[str, Trick]:
  """The trick list a recipe.json was measured with: `TRICK_LISTS[result['trick_list']]`, the first
  list for a json written before the list had a version."""
  return TRICK_LISTS[int(result.get("trick_list", 1))]


def tricks_of(config: ml_collections.ConfigDict) -> list[str]:
  return arms_lib.names(config.benchmark.recipe_tricks)


def kept_fields(config: ml_collections.ConfigDict) -> list[str]:
  """The fields no trick changes (`benchmark.recipe_keep`): their values in `config` win."""
  return arms_lib.names((config.get("benchmark") or {}).get("recipe_keep", ""))  # none in a training config


def keep_command_line(config: ml_collections.ConfigDict, fields: list[str]) -> ml_collections.ConfigDict:
  """`config` with the fields the command line set (`fields`, dotted) added to `benchmark.recipe_keep`,
  outside the benchmark block: a trick leaves them as given (`apply_tricks`)."""
  if "benchmark" not in config:
    return config
  kept = kept_fields(config)
  kept += [f for f in fields if not f.startswith("benchmark.") and f not in kept]
  with config.unlocked():
    config.benchmark.recipe_keep = ",".join(kept)
  return config


def trick_changes(config: ml_collections.ConfigDict, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """(applied, kept): what trick `name` changes in `config`, and the changes it leaves out because
  `benchmark.recipe_keep` keeps the field ({field: the trick's value})."""
  keep = set(kept_fields(config))
  changes = TRICKS[name].changes(config)
  applied = {k: v for k, v in changes.items() if k not in keep}
  return applied, {k: v for k, v in changes.items() if k in keep}


def apply_tricks(config: ml_collections.ConfigDict, names: list[str]) -> ml_collections.ConfigDict:
  """A copy of the benchmark `config` with the tricks `names` applied, in order; a field
  `benchmark.recipe_keep` keeps (one the command line set) keeps its value."""
  c = ml_collections.ConfigDict(config.to_dict())
  for name in names:
    c.update_from_flattened_dict(trick_changes(c, name)[0])
  return c


def kept_changes(config: ml_collections.ConfigDict) -> dict[str, dict[str, Any]]:
  """Per step of the recipe, the trick changes a kept field left out ({step: {field: [the trick's
  value, the value kept]}}); steps with none are absent."""
  out = {}
  c = ml_collections.ConfigDict(config.to_dict())
  for name in tricks_of(config):
    applied, kept = trick_changes(c, name)
    if kept:
      out[name] = {k: [v, _get(c, k)] for k, v in kept.items()}
    c.update_from_flattened_dict(applied)
  return out


def _get(config: ml_collections.ConfigDict, dotted: str) -> Any:
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


def uses_muon(config: ml_collections.ConfigDict) -> bool:
  return config.optim.name in ("muon", "muon_groups")


def speedrun_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The whole recipe (`benchmark.recipe_tricks`, all applied) as a family of the protocol: the
  ladder's R6 and the `speedrun` family. Its sweep centres on `benchmark.recipe_muon_lr` when it
  uses Muon; its tuning ranks each run by its better iterate (`benchmark.iterate='best'`), so it
  averages only where averaging helps on the tuning seeds."""
  c = apply_tricks(config, tricks_of(config))
  if uses_muon(c):
    c.optim.learning_rate = float(config.benchmark.recipe_muon_lr)
  c.benchmark.iterate = "best"
  c.benchmark.family = f"speedrun-{c.optim.name}-{c.optim.schedule}"
  return c


def validate_recipe(config: ml_collections.ConfigDict) -> None:
  """Checks the recipe's fields and that every cumulative step is a valid experiment (an option the
  model cannot take, e.g. U-net skips with an odd layer count, fails here, before any training)."""
  b = config.benchmark
  names = tricks_of(config)
  errors = []
  unknown = [n for n in names if n not in TRICKS]
  if unknown or not names:
    errors.append(f"benchmark.recipe_tricks={b.recipe_tricks!r}: give tricks from {','.join(TRICKS)}")
  if len(set(names)) != len(names):
    errors.append(f"benchmark.recipe_tricks={b.recipe_tricks!r} names a trick twice")
  budgets = list(b.recipe_budgets) + list(b.recipe_budget_extensions)
  if any(float(f) <= max(float(x) for x in b.budgets) for f in budgets) or budgets != sorted(budgets):
    errors.append(
      "benchmark.recipe_budgets and recipe_budget_extensions must be increasing factors of N beyond "
      f"benchmark.budgets (max {max(b.budgets)}), got {tuple(b.recipe_budgets)} and {tuple(b.recipe_budget_extensions)}"
    )
  if not float(b.recipe_muon_lr) > 0:
    errors.append(f"benchmark.recipe_muon_lr must be > 0, got {b.recipe_muon_lr}")
  fields = set(config_lib.flatten(config))
  unknown = [f for f in kept_fields(config) if f not in fields]
  if unknown:
    errors.append(
      f"--config.benchmark.recipe_keep={b.get('recipe_keep', '')!r} names {unknown}, not fields of the config: "
      "give dotted fields such as model.relu2"
    )
  if errors:
    raise ValueError("; ".join(errors))
  for k in range(1, len(names) + 1):
    try:
      specs.validate_benchmark(apply_tricks(config, names[:k]))
    except ValueError as e:
      raise ValueError(
        f"the recipe's step {names[k - 1]!r} (with {names[: k - 1]} before it) is not a valid run: {e}"
      ) from None


def anchor_config(config: ml_collections.ConfigDict, extra: list[float]) -> ml_collections.ConfigDict:
  """The R4 anchor's config: the protocol's AdamW-cosine family with its budget curve extended."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.benchmark.budgets = tuple(sorted({float(f) for f in config.benchmark.budgets} | set(extra)))
  c.benchmark.methods = ""
  return c


def step_configs(config: ml_collections.ConfigDict, anchor_lr: float) -> dict[str, ml_collections.ConfigDict]:
  """Each cumulative step's benchmark config, its sweep centred on the anchor's tuned LR (AdamW) or
  on `benchmark.recipe_muon_lr` (Muon)."""
  names = tricks_of(config)
  out = {}
  for k, name in enumerate(names):
    c = apply_tricks(config, names[: k + 1])
    c.optim.learning_rate = float(config.benchmark.recipe_muon_lr) if uses_muon(c) else float(anchor_lr)
    c.benchmark.methods = ""
    out[name] = c
  return out


def _spec_of(c: ml_collections.ConfigDict) -> Callable[[int, float, int], dict[str, Any]]:
  betas = [float(x) for x in c.benchmark.betas]
  return lambda seed, lr, steps: specs.run_spec(
    c, kind="anchor", seed=seed, lr=lr, steps=steps, beta=betas[0], betas=betas
  )


def iterate_loss(run: dict[str, Any], iterate: str, beta: float) -> float:
  return run["final_raw"] if iterate == "raw" else tuning.averaged_loss(run, beta)


def train_steps(
  configs: dict[str, ml_collections.ConfigDict], config: ml_collections.ConfigDict, runner: Runner
) -> dict[str, dict[str, Any]]:
  """Every step's tuning (all sweeps in lockstep; `configs`: `step_configs`') and headline runs."""
  swept = tuning.sweep_lrs([(c, _spec_of(c), tuning.best_loss) for c in configs.values()], runner)
  chosen = {}
  for (name, c), sw in zip(configs.items(), swept):
    at_best = [sw["sweep"][sw["grid"].index(sw["best_lr"])], sw["second"][sw["top2"].index(sw["best_lr"])]]
    averaging = tuning.choose_averaging(at_best, [float(x) for x in c.benchmark.betas])
    chosen[name] = {k: averaging[k] for k in ("beta", "iterate", "iterate_losses")} | {
      "lr": sw["best_lr"],
      "grid": sw["grid"],
      "best_at_edge": sw["best_at_edge"],
      "sweep_loss": [tuning.best_loss(r) for r in sw["sweep"]],
    }
  n = int(config.trainer.steps)
  seeds = [int(s) for s in config.benchmark.seeds]
  headline = [
    specs.run_spec(c, kind="anchor", seed=s, lr=chosen[name]["lr"], steps=n, beta=chosen[name]["beta"])
    for name, c in configs.items()
    for s in seeds
  ]
  results = runner.run(headline, "recipe steps (headline seeds, N)")
  out = {}
  for k, name in enumerate(configs):
    runs = results[k * len(seeds) : (k + 1) * len(seeds)]
    ch = chosen[name]
    curves = {name: {str(r["seed"]): r["curve"] for r in runs}}
    out[name] = ch | {
      "plateaus": protocol.plateau_runs(curves, n, float(config.benchmark.plateau_margin)),
      "runs": {
        str(r["seed"]): {
          "final_raw": r["final_raw"],
          "final_averaged": r["final_averaged"],
          "loss": iterate_loss(r, ch["iterate"], ch["beta"]),
          "key": r.get("key"),
        }
        for r in runs
      },
    }
  return out


def anchor_plateaus(curves: dict[str, Any], n: int, margin: float) -> list[dict[str, Any]]:
  """The anchor's N-step runs (`tuning.budget_curves`' runs) that sit on an early plateau."""
  at_n = {key.split("/")[0]: r["curve"] for key, r in curves["runs"].items() if r["steps"] == n}
  return protocol.plateau_runs({"anchor": at_n}, n, margin)


def with_seeds(config: ml_collections.ConfigDict, seeds: list[int]) -> ml_collections.ConfigDict:
  """`config` with `seeds` as its headline seeds (a run's spec holds no benchmark field: the runs
  already trained stay cached)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.benchmark.seeds = tuple(seeds)
  return c


def anchor_curves(curves: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
  """Per seed, the anchor's averaged budget curve: {'steps', 'loss'}."""
  return {
    s: {"steps": list(curves["budgets"]), "loss": losses} for s, losses in curves["curves"]["averaged_baseline"].items()
  }


def step_figures(
  name: str,
  step: dict[str, Any],
  previous: dict[str, float],
  anchor: dict[str, dict[str, list[float]]],
  ms: dict[str, float],
  n: int,
  eval_se: float | None = None,
) -> dict[str, Any]:
  """One step's speed-up (per seed and summarised), whether it pays against the anchor
  (`protocol.cost_verdict` at N steps), its wall-clock ratio and paired verdict against the previous
  step (`previous`: seed -> loss), judged with `eval_se` (the paired per-batch standard error) besides
  the seeds'. Pure: the tests recompute it from recipe.json."""
  seeds = sorted(step["runs"], key=int)
  losses = [step["runs"][s]["loss"] for s in seeds]
  per_seed, lower_bound, upper_bound = [], [], []
  for s, loss in zip(seeds, losses):
    steps, curve = anchor[s]["steps"], anchor[s]["loss"]
    reach = protocol.steps_to_reach(steps, curve, loss)
    per_seed.append(None if reach.steps is None else reach.steps / n)
    lower_bound.append(reach.lower_bound)
    upper_bound.append(reach.upper_bound)
  present = [x for x in per_seed if x is not None]
  mean, std = protocol.mean_std(present) if present else (None, None)
  speedup = {
    "mean": mean,
    "std": std,
    "per_seed": per_seed,
    "lower_bound": any(lower_bound),
    "upper_bound": any(upper_bound),
    "n_lower_bound": sum(lower_bound),
    "n_upper_bound": sum(upper_bound),
  }
  wall = None
  if mean is not None and name in ms and "anchor" in ms:
    wall = {"mean": mean * ms["anchor"] / ms[name], "step_ms": ms[name], "anchor_ms": ms["anchor"]}
  curves = [(anchor[s]["steps"], anchor[s]["loss"]) for s in seeds]
  return {
    "name": name,
    "seeds": [int(s) for s in seeds],
    "loss": losses,
    "speedup": speedup,
    "verdict": protocol.cost_verdict(losses, [n] * len(seeds), curves, n, eval_se),
    "wallclock_ratio": wall,
    "vs_previous": protocol.paired_difference(losses, [previous[s] for s in seeds], eval_se),
  }


def recipe_figures(result: dict[str, Any]) -> list[dict[str, Any]]:
  """Every step's figures, the anchor first (its own N-step loss read on its curve), from a
  recipe.json record: what the report shows and the tests recompute."""
  n = int(result["steps"])
  anchor = result["anchor"]["curves"]
  ms = result["timing"]["ms_per_step"]
  eval_se = (result["anchor"].get("eval") or {}).get("paired_se")
  previous = dict(result["anchor"]["at_n"])
  anchor_runs = {"runs": {s: {"loss": x} for s, x in previous.items()}}
  rows = [step_figures("anchor", anchor_runs, previous, anchor, ms, n, eval_se)]
  rows[0]["vs_previous"] = None
  for name in result["tricks"]:
    step = result["step_runs"][name]
    row = step_figures(name, step, previous, anchor, ms, n, eval_se)
    row.update(lr=step["lr"], iterate=step["iterate"], beta=step["beta"], record=result["records"][name])
    rows.append(row)
    previous = {s: r["loss"] for s, r in step["runs"].items()}
  rows[0].update(lr=result["anchor"]["lr"], iterate="averaged", beta=result["anchor"]["beta"], record="R4")
  return rows


def _below_curve(steps: dict[str, Any], anchor: dict[str, dict[str, list[float]]]) -> bool:
  """Whether any step's loss on any seed lies below the end of the anchor's curve (a lower bound)."""
  for step in steps.values():
    for s, r in step["runs"].items():
      if s in anchor and protocol.steps_to_reach(anchor[s]["steps"], anchor[s]["loss"], r["loss"]).lower_bound:
        return True
  return False


def run_recipe(config: ml_collections.ConfigDict, workdir: str, command: str = "") -> dict[str, Any]:
  """The trick-by-trick recipe for `config`: trains the anchor and every step, times them, writes
  recipe-<preset>.{json,md,png} into `workdir` (and `benchmark.publish`). Every run goes through the
  runner's cache: an interrupted recipe resumes, and the R4 anchor's runs are the ladder's."""
  specs.validate_benchmark(config)
  validate_recipe(config)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  b = config.benchmark
  n = int(config.trainer.steps)
  print(f"recipe {b.preset}: tricks {b.recipe_tricks}, N={n}; workdir {workdir}", flush=True)
  for name, fields in kept_changes(config).items():
    kept = ", ".join(f"{k}={v[1]!r} (the trick's {v[0]!r})" for k, v in fields.items())
    print(f"  step {name}: kept as given (benchmark.recipe_keep): {kept}", flush=True)
  extra = [float(f) for f in b.recipe_budgets]
  acfg = anchor_config(config, extra)

  def with_step_sweeps(lr: float, beta: float) -> list[dict[str, Any]]:
    # The anchor's curve and every step's first sweep grid train together (the steps' sweeps are
    # centred on the anchor's LR, known now); the lockstep sweep below finds them cached.
    first = [
      _spec_of(c)(int(b.tuning_seeds[0]), lr_, n)
      for c in step_configs(config, lr).values()
      for lr_ in tuning.lr_grid(float(c.optim.learning_rate), int(b.lr_points))
    ]
    return tuning.curve_specs(acfg, lambda f: lr, beta) + first

  with make_runner(config, workdir) as runner:
    tuned = tuning.tune(acfg, runner, also=with_step_sweeps)
    curves = tuning.budget_curves(acfg, runner, tuned)
    configs = step_configs(config, tuned["best_lr"])
    steps = train_steps(configs, config, runner)
    flagged = anchor_plateaus(curves, n, float(b.plateau_margin)) + [p for st in steps.values() for p in st["plateaus"]]
    seeds = [int(s) for s in b.seeds]
    added = [int(s) for s in b.plateau_seeds if int(s) not in seeds]
    if flagged and added:
      print(f"--- plateau runs {flagged}; adding seeds {added} to every step and the anchor", flush=True)
      config = with_seeds(config, seeds + added)
      b = config.benchmark
      acfg = anchor_config(config, extra)
      curves = tuning.budget_curves(acfg, runner, tuned)
      configs = step_configs(config, tuned["best_lr"])
      steps = train_steps(configs, config, runner)
    plateaus = {"runs": flagged, "seeds_added": added if flagged else []}
    if plateaus["seeds_added"]:  # the rule read again over every seed (each step's own: its `plateaus`)
      plateaus["anchor_after"] = anchor_plateaus(curves, n, float(b.plateau_margin))
    for factor in b.recipe_budget_extensions:
      if not _below_curve(steps, anchor_curves(curves)):
        break
      print(f"--- a step's loss lies below the anchor's curve; extending it to {factor} N", flush=True)
      extra.append(float(factor))
      acfg = anchor_config(config, extra)
      curves = tuning.budget_curves(acfg, runner, tuned | {"per_budget_lr": _per_budget_lr(tuned, acfg)})
  print("--- timing (interleaved, this process)", flush=True)
  entries = {"anchor": (acfg, tuned["best_lr"], tuned["averaging_beta"])}
  entries |= {name: (configs[name], steps[name]["lr"], steps[name]["beta"]) for name in steps}
  timed = timing.time_baselines(entries)
  at_n = {
    s: curves["curves"]["averaged_baseline"][s][curves["budgets"].index(n)]
    for s in curves["curves"]["averaged_baseline"]
  }
  result: dict[str, Any] = {
    "preset": b.preset,
    "task": specs.task_name(config),
    "command": command,
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "machine": report.machine_info(),
    "code_version": keys.code_versions(config, []),
    "config": json.loads(config.to_json()),
    "steps": n,
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
      "curves": anchor_curves(curves),
      "at_n": at_n,
      "eval": figures.eval_errors(
        curves["runs"], sorted(curves["curves"]["averaged_baseline"], key=int), curves["budgets"], n
      ),
    },
    "step_runs": steps,
    "plateaus": plateaus,
    "timing": timed,
    "runs_trained": runner.ran,
    "runs_cached": runner.reused,
  }
  rows = recipe_figures(result)
  result["figures"] = rows
  last = rows[-1]
  result["total_speedup"] = {"name": last["name"], **last["speedup"], "wallclock_ratio": last["wallclock_ratio"]}
  result["wall_s"] = time.perf_counter() - t_start
  result["invocations"] = report.earlier_invocations(os.path.join(workdir, f"recipe-{b.preset}.json")) + [
    {"date": result["date"], "wall_s": result["wall_s"], "runs_trained": runner.ran, "runs_cached": runner.reused}
  ]
  write_recipe(result, workdir, str(b.publish))
  print("\n" + report.recipe_markdown(result))
  print(f"recipe wall time {result['wall_s']:.0f} s ({runner.ran} runs trained, {runner.reused} cached)", flush=True)
  return result


def _per_budget_lr(tuned: dict[str, Any], acfg: ml_collections.ConfigDict) -> dict[str, float]:
  """The anchor's LR per budget, the budgets past 2N taking the 2N check's (as `tune` gives 1.5N+)."""
  base = tuned["per_budget_lr"]
  beyond = base.get("2.0", tuned["best_lr"])
  return {str(float(f)): base.get(str(float(f)), beyond) for f in acfg.benchmark.budgets}


def write_recipe(result: dict[str, Any], workdir: str, publish: str) -> None:
  """recipe-<preset>.{json,md,png} into `workdir` and `publish`."""
  for folder in [workdir] + ([publish] if publish else []):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"recipe-{result['preset']}.json"), "w") as f:
      json.dump(result, f, indent=1)
    with open(os.path.join(folder, f"recipe-{result['preset']}.md"), "w") as f:
      f.write(report.recipe_markdown(result) + "\n")
    report.save_recipe_plot(result, folder)
