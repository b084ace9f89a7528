"""Benchmark protocol configs: tuned anchors on a budget curve against hybrid training.

  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long          # AdamW, cosine
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long,wsd      # AdamW, WSD
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long,muon     # Muon, cosine
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long,speedrun # the speedrun recipe
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long --config.benchmark.study=recipe
      # the speedrun recipe trick by trick against the R4 anchor (`hybridjax/bench/studies/recipe`)
  python -m experiments.benchmark --quick                                                  # the smoke run
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long --config.benchmark.study=ladder
      # the fairness ladder: every arm from the seed's and NiNo's conditions up to R4-R5, the verdict

Presets: `quick` (the protocol on a one-layer model in 2-3 minutes; the tests run it), `tiny` (the
`gpt2_small` tiny model at 600 steps, comparable with the project's earlier figures), `long` (N = 3000
steps of a 0.12M-param model: the preset sized for 2 CPU cores), `deep` (6 layers of head dimension
32 at N = 1500: where the recipe's U-net, value-embedding and value-residual steps connect distinct
layers) and `124m` (GPT-2 Small on a GPU).
The family variants `wsd` and `muon` change the optimizer or the schedule, `speedrun` applies the whole
speedrun recipe (its architecture, Muon with its parameter groups, its schedule); each family gets its
own learning-rate sweep and budget curve, and no figure mixes families. The speedrun family's tricks
apply after the command line (`after_command_line`), with its `benchmark.recipe` fields.

The experiment blocks (model, data, optim, trainer, hybrid) are those of every run; `benchmark`
holds the protocol's settings, a study's own in its block (`benchmark.ladder`, `benchmark.recipe`).
"""

from __future__ import annotations

import ml_collections

from experiments.configs import gpt2_small
from hybridjax import config as config_lib
from hybridjax import schema
from hybridjax.bench import specs, speedrun
from hybridjax.bench import study as study_lib
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.command_line import prepare_overrides  # noqa: F401 (the arms' flags: hybridjax.cli calls it)

PRESETS = ("quick", "tiny", "long", "deep", "124m")
FAMILIES = ("wsd", "muon", "speedrun")


# The jump schedule as chosen at `long` (N = LONG_STEPS; `_long`): candidate horizons k, real steps
# between attempts, and the RSSM forecaster's real steps between snapshots (the forecast arms').
LONG_STEPS = 3000
LONG_JUMP_HORIZONS = (50, 100, 200)
LONG_JUMP_EVERY = 100
LONG_FORECAST_EVERY = 50


def scaled_steps(steps: int, n: int) -> int:
  """`steps` (a count of real or schedule steps chosen at N = LONG_STEPS) in proportion to a run of
  `n` steps: rounded, at least 1."""
  return max(1, round(steps * n / LONG_STEPS))


def scale_jump_schedule(c: ml_collections.ConfigDict) -> None:
  """Sets `hybrid.jump.horizons`, `hybrid.jump.every` and `hybrid.jump.forecaster.every` to long's
  values in proportion to the run's N (`trainer.steps`): at long, long's values unchanged.

  Why: the jump arms attempt a jump every `every` real steps between `start_fraction` and
  `stop_fraction` of the run, and only where the longest horizon still ends inside that window. At
  long's absolute settings a run of N = 600 (`tiny`) has room for about one attempt, so its jump arms
  barely jump and their comparison tests nothing; scaled, every preset's arms attempt about as many
  jumps per run as long's (about 15), each the same fraction of the schedule. The horizons stay
  distinct (a collision after rounding takes the next integer up).
  """
  n = int(c.trainer.steps)
  if n == LONG_STEPS:
    return  # long's own values, exactly (its published runs keep their keys)
  horizons: list[int] = []
  for k in LONG_JUMP_HORIZONS:
    horizons.append(max(scaled_steps(k, n), horizons[-1] + 1 if horizons else 1))
  c.hybrid.jump.update(horizons=tuple(horizons), every=scaled_steps(LONG_JUMP_EVERY, n))
  c.hybrid.jump.forecaster.every = scaled_steps(LONG_FORECAST_EVERY, n)


def _long(c: ml_collections.ConfigDict) -> None:
  """2 layers, d_model 64, context 64, batch 12 (0.12M params; ~18 ms a step in each of two
  single-thread workers on 2 cores).

  Chosen so one family's protocol (~45 N steps) fits in 25 minutes on 2 idle cores at N = 3000 (with
  batch 16 it took ~30) while still showing
  what the benchmark is about: at this size averaging is worth hundreds of steps mid-run and a 25%
  larger budget lowers the loss well beyond the seed noise (both checked by every run: `phenomena`
  in benchmark.json). The LR sweep is centred on 6e-3, where this model's best LR was found.
  """
  c.model.update(n_layer=2, d_model=64, n_head=4, n_ctx=64)
  c.trainer.update(steps=3000, batch_size=12, eval_batches=48)
  c.optim.update(learning_rate=6e-3, warmup_steps=50)
  c.hybrid.update(warmup_steps=100, full_steps=20)
  # Jumps as chosen on the tuning seeds (docs/experiments.md): the slow EMA at 0.995 with the
  # averaging EMA at 0.99 (its drift forecasts the averaged iterate better than 0.998's; the
  # slow EMA keeps that lag ratio of 2 for whatever averaging beta a family's tuning chooses,
  # `hybrid.jump.slow_lag_ratio`), k in {50, 100, 200} every 100 real steps,
  # between 5% and 60% of the run, accepted on any probe gain (trend_credit 0: with 0.5 or 1 no
  # jump is ever accepted and the run is the averaged baseline).
  c.hybrid.jump.update(horizons=LONG_JUMP_HORIZONS, every=LONG_JUMP_EVERY, trend_credit=0.0)
  c.hybrid.jump.forecaster.every = LONG_FORECAST_EVERY


def _deep(c: ml_collections.ConfigDict) -> None:
  """`long` made deeper: 6 layers, d_model 64, 2 heads (head_dim 32), context 64, batch 12, N = 1500
  (0.32M params; about three times `long`'s step time, so a run costs about what `long`'s does).

  For the speedrun recipe: at `long`'s 2 layers its later steps have nothing to connect (the U-net's
  one skip only rescales block 1's input, the one value-embedding table reaches every layer, the
  value residual has one later layer to reach). With 6 layers, an even count, the U-net pairs
  distinct layers (2-3, 1-4, 0-5), the value-embedding table reaches the first and the last layer
  only, and the value residual reaches five later layers; head_dim 32 (not 16) leaves QK-normed
  scores a wider range (±5.7 at GPT-2's scale). The LR sweep starts at `long`'s 6e-3 and extends
  while the best LR sits at an edge.
  """
  _long(c)
  c.model.update(n_layer=6, n_head=2)
  c.trainer.steps = 1500


def get_config(arg: str = "long") -> ml_collections.ConfigDict:
  """Returns the benchmark config for `arg`: a preset from `PRESETS`, optionally followed by family
  variants (`long,muon`, `long,wsd`, `long,muon,wsd`)."""
  preset, *variants = (arg or "long").split(",")
  if preset not in PRESETS or any(v not in FAMILIES for v in variants):
    raise ValueError(
      f"unknown benchmark config {arg!r}: use a preset from {list(PRESETS)} optionally followed by "
      f"{list(FAMILIES)}, e.g. --config=experiments/configs/benchmark.py:long,muon"
    )
  base = {"quick": "tiny,micro", "long": "tiny", "deep": "tiny"}.get(preset, preset)
  c = gpt2_small.get_config(base)
  c.preset = preset
  if preset == "long":
    _long(c)
  if preset == "deep":
    _deep(c)
  if preset != "quick":  # quick sets its own jump schedule below
    scale_jump_schedule(c)
  c.mode = specs.BENCHMARK_MODE  # informational: each run sets its own mode
  c.trainer.progress = False
  c.trainer.checkpoint_every = 0  # method runs save only at the end
  c.trainer.compile_cache = True  # in <workdir>/jax_cache, which a cold benchmark starts empty
  c.trainer.averaging = "ema"
  # A jump arm's slow EMA lags twice the averaging EMA, whatever beta a family's tuning chooses.
  c.hybrid.jump.slow_lag_ratio = 2.0
  if "muon" in variants:
    c.optim.name = "muon"
    c.optim.learning_rate = 0.02 if preset != "124m" else 0.01
  if "wsd" in variants:
    c.optim.schedule = "wsd"

  # The benchmark's own block (`specs.BENCHMARK_FIELDS`: each field's default, check and doc), added to
  # the locked config below by its owner; a preset sets its own values here.
  b = specs.BenchmarkBlock(schema.block(specs.BENCHMARK_FIELDS))
  b.preset = preset
  b.family = f"{c.optim.name}-{c.optim.schedule}"
  # The arms the benchmark runs (`benchmark.arms` below), the headline's first: outer momentum, the
  # arm that did best on the tuning seeds.
  b.methods = (
    "outer_momentum,jump,skip_control,jump_outer,skip_control_outer,jump_forecast,skip_control_forecast,hybrid"
  )
  # Outer momentum (K, eta, mu) of the arms that use it; (100, 0.8, 0.75) was reported best at 125M.
  outer = (100, 0.8, 0.75)
  study_lib.add_defaults(b, preset)  # each study's block (its config.py): benchmark.ladder, benchmark.recipe
  # The arms the ladder runs (`bench/studies/ladder`): at every rung, and at the tuned rungs R3-R6 only.
  b.ladder.methods = "hybrid,velocity_control,jump,skip_control,outer_momentum,selective,selective_control"
  b.ladder.cosine_methods = "jump_forecast,skip_control_forecast"

  if preset == "quick":  # the whole protocol in 2-3 minutes, for the tests
    c.trainer.update(steps=40, batch_size=8, eval_batches=2)
    c.optim.update(warmup_steps=4, learning_rate=0.012)
    c.hybrid.update(warmup_steps=8, full_steps=4, confidence_threshold=0.0)
    c.hybrid.jump.update(horizons=(2, 4, 8), every=6, start_fraction=0.2, stop_fraction=0.8)
    b.update(methods="jump,skip_control", seeds=(1, 2), plateau_seeds=(), budgets=(0.5, 1.0, 1.25, 2.0))
    b.update(lr_points=3, lr_max_extensions=1, workers=1, eval_points=2, timing_rounds=4, timing_steps=10)
    # Three rungs of the ladder and two tricks of the recipe on the micro model (the tests run them;
    # its one layer takes no U-net skips).
    b.ladder.update(rungs="R1,R3,R6", methods="jump,skip_control", cosine_methods="", constant_eval_points=8)
    b.recipe.update(tricks="schedule,muon", budgets=(3.0,), budget_extensions=(4.0,))
    outer = (10, 0.8, 0.75)
  elif preset == "124m":
    b.update(workers=1, timing_rounds=4, timing_steps=10)
  b.arms = specs.OpenBlock(arms(outer))
  with c.unlocked():
    c.benchmark = b
  if "speedrun" in variants:
    if len(variants) > 1:
      raise ValueError(
        f"benchmark config {arg!r}: the speedrun family sets its own optimizer and schedule; use it alone"
      )
    c = speedrun.speedrun_config(c)
    b.update(c.benchmark)  # the recipe's values, into the checked blocks (its copy is plain)
    c.benchmark = b
  c.lock()  # but for `benchmark.arms`, an open block (specs.OpenBlock)
  return c


def before_command_line(
  config: ml_collections.ConfigDict, arg: str, given: dict[str, str]
) -> ml_collections.ConfigDict:
  """`get_config(arg)` before the command line's overrides (`given`: {field: value}) are applied
  (`hybridjax.cli` calls it): with the block of the task `--config.benchmark.task` names, at its defaults
  (the block its module's `READS` names first, from its `default_task_config()`: the `mlp` task's), so that
  the command line can set its fields (`--config.benchmark.task=mlp --config.mlp.features=(64,64)`); a field
  of a built-in task's block given for another task is refused, naming the task that reads it. A task that
  does not load is named by the benchmark's checks."""
  del arg
  task = given.get("benchmark.task", specs.task_name(config))
  for name in dict.fromkeys([task, *tasks_lib.BUILTIN_TASKS]):
    try:
      module = tasks_lib.load_task(name)
    except ValueError:
      continue
    reads, default = getattr(module, "READS", ()), getattr(module, "default_task_config", None)
    if not reads or default is None or reads[0] in config:
      continue
    if name == task:
      with config.unlocked():
        config[reads[0]] = default()
    elif named := sorted(f for f in given if f.startswith(reads[0] + ".")):
      raise ValueError(
        f"--config.{named[0]} is a field of the {name} task's block, and the benchmark's task is {task!r}: add "
        f"--config.benchmark.task={name}, or leave out --config.{reads[0]}.*"
      )
  return config


def after_command_line(config: ml_collections.ConfigDict, arg: str, fields: list[str]) -> ml_collections.ConfigDict:
  """`get_config(arg)` once the command line's overrides (`fields`, dotted) are applied (`hybridjax.cli`
  calls it): the fields the command line set outside the benchmark block join `benchmark.recipe.keep`
  (a trick of the recipe, R6 or the speedrun family leaves them as given), and the `speedrun` family's
  tricks are applied after the command line, as the ladder's R6 applies them: every field the command
  line did not set back at the preset's value, then `speedrun.speedrun_config` with the command line's
  `benchmark.recipe.tricks`, `muon_lr` and `keep`, then the command line's values again (its LR, its
  `benchmark.iterate`). So a value a trick derives follows the overrides (the momentum warm-up
  follows `trainer.steps`, the attention scale the head dimension). The jump schedule follows the
  command line's `trainer.steps` too (`scale_jump_schedule`), except the jump fields it set itself."""
  speedrun.keep_command_line(config, fields)
  preset, *variants = (arg or "long").split(",")
  if "speedrun" not in variants:
    return _jump_schedule_for_steps(config, preset, fields)
  given = {k: v for k, v in config_lib.flatten(config).items() if _is_given(k, fields)}
  untricked = config_lib.flatten(get_config(preset))
  restored = {k: v for k, v in untricked.items() if not _is_given(k, fields) and not k.startswith("benchmark.")}
  c = ml_collections.ConfigDict(config.to_dict())
  c.update_from_flattened_dict(restored | {k: untricked[k] for k in ("benchmark.iterate", "benchmark.family")})
  c = speedrun.speedrun_config(c)
  c.update_from_flattened_dict(given)
  return _jump_schedule_for_steps(c, preset, fields)


# The fields `scale_jump_schedule` derives from `trainer.steps`.
JUMP_SCHEDULE_FIELDS = ("hybrid.jump.horizons", "hybrid.jump.every", "hybrid.jump.forecaster.every")


def _jump_schedule_for_steps(
  config: ml_collections.ConfigDict, preset: str, fields: list[str]
) -> ml_collections.ConfigDict:
  """`config` with the jump schedule scaled to the command line's `trainer.steps` (the preset's was
  scaled to the preset's N: at a shorter run its horizons would not fit the jump window, and the jump
  arms would never jump), each jump field the command line set kept as given. `quick` keeps its own
  absolute schedule."""
  if preset == "quick" or not _is_given("trainer.steps", fields):
    return config
  scaled = ml_collections.ConfigDict(config.to_dict())
  scale_jump_schedule(scaled)
  flat = config_lib.flatten(scaled)
  config.update_from_flattened_dict({f: flat[f] for f in JUMP_SCHEDULE_FIELDS if not _is_given(f, fields)})
  return config


def _is_given(field: str, fields: list[str]) -> bool:
  return any(field == f or field.startswith(f + ".") for f in fields)


def arms(outer: tuple[int, float, float]) -> ml_collections.ConfigDict:
  """The method arms, as data (`hybridjax.bench.arms`): each a method, its mode, the config it
  changes, and for a control arm the arm it controls. `outer`: outer momentum's (K, eta, mu)."""
  every, eta, mu = outer
  with_outer = {"optim": {"outer_every": every, "outer_eta": eta, "outer_mu": mu}}
  forecast = {"hybrid": {"jump": {"forecast": "rssm"}}}
  arms = {
    # The velocity predictor of the config's hybrid block, its ablations and its control (alpha = 0).
    "hybrid": {"method": "velocity"},
    "constant_alpha": {"method": "velocity", "overrides": {"hybrid": {"velocity": {"constant_alpha": 1.0}}}},
    "no_corrector": {"method": "velocity", "overrides": {"hybrid": {"velocity": {"corrector": {"enabled": False}}}}},
    # Baseline steps with outer Nesterov momentum every K steps (the baseline loop's own step).
    "outer_momentum": {"method": "outer_momentum", "mode": "baseline", "overrides": with_outer},
    # Jumps (the config's hybrid.jump block) and their skip control (the same decisions, each only
    # advancing the schedule); along outer momentum's drift; with the RSSM forecaster.
    "jump": {"method": "jump"},
    "jump_outer": {"method": "jump", "overrides": with_outer},
    "jump_forecast": {"method": "jump", "overrides": forecast},
    # Per-sequence selective backprop: 2B sequences forwarded, the B with the highest loss
    # backpropagated; its control backpropagates a random B of the same 2B.
    "selective": {"method": "selective_backprop"},
  }
  controls = {"velocity_control": "hybrid", "selective_control": "selective"}  # each the control of an arm
  controls |= {"skip_control": "jump", "skip_control_outer": "jump_outer", "skip_control_forecast": "jump_forecast"}
  return ml_collections.ConfigDict(
    arms | {name: arms[of] | {"control": True, "control_of": of} for name, of in controls.items()}
  )
