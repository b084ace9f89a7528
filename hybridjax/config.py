"""The config's fields, each declared once (`schema.Field`: default, check, doc, runtime or not),
and the default blocks built from the declarations.

Every config has the top-level fields (`TOP_FIELDS`) and the blocks of `BLOCKS`: `optim` (declared
in `optim` and `optimizers`, beside what reads them), `trainer`, `hybrid` (the controller's, and each
built-in method's block from its own `FIELDS`), `mesh` and `distributed`. A task's blocks (the GPT-2
task's `model` and `data`, the MLP's `mlp`) are the task's. The configs handed out are locked
(`ConfigDict.lock()`): a misspelt key fails where it is set. The whole-config checks that read these
declarations are `preflight`'s.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from hybridjax import optim as optim_lib
from hybridjax import registry, schema


def default_optim_config() -> ml_collections.ConfigDict:
  """The `optim` block at its defaults (`optim.FIELDS`): AdamW with linear warm-up and cosine decay,
  and global-norm clipping."""
  return optim_lib.default_optim_config()


def _averaging_off(config: ml_collections.ConfigDict) -> str | None:
  averaging = (config.get("trainer") or {}).get("averaging", "none")
  if averaging == "ema":
    return None
  return (
    f"--config.trainer.averaging={averaging!r} keeps no average of the params (loop.drivers.averaging_beta). "
    "Set --config.trainer.averaging=ema to train with it"
  )


F = schema.Field
_int, _num, _choice = schema.check_int, schema.check_num, schema.check_choice
_bool, _str = schema.check_bool, schema.check_str

# `trainer`: read by the loop (`loop.train`, `loop.drivers`). A runtime field changes how a run
# executes, not what it trains: a resume may change it.
TRAINER_FIELDS: tuple[schema.Field, ...] = (
  F("steps", 600, _int(1), "optimizer steps of the run (a resume may extend it)", runtime="resume"),
  F("batch_size", 16, _int(1), "sequences (examples) a step"),
  F("grad_accum", 1, _int(1), "micro-batches per optimizer step; must divide batch_size"),
  F("log_every", 20, _int(1), "steps between log records", runtime="resume"),
  F("eval_every", 100, _int(0), "steps between evals; 0 = only at the end", runtime="resume"),
  F("eval_batches", 8, _int(1), "held-out batches an eval averages", runtime="resume"),
  F("checkpoint_every", 200, _int(0), "steps between checkpoints; 0 = only at the end", runtime="resume"),
  F("max_to_keep", 3, _int(1), "checkpoints kept", runtime="resume"),
  F("progress", True, _bool, "a tqdm progress bar", runtime="host"),
  F("compile_cache", True, _bool, "JAX's persistent compilation cache", runtime="host"),
  F("compile_cache_dir", "", _str, "'' = ~/.cache/hybridjax/jax_cache", runtime="host"),
  F("memory_limit_bytes", 0, _int(0), "0 = off; above it: warn and save an emergency checkpoint once", runtime="host"),
  F(
    "max_nonfinite_steps",
    20,
    _int(1),
    "stop (TrainingDiverged) after this many consecutive skipped non-finite updates; the last good checkpoint is kept",
    runtime="resume",
  ),
  F(
    "averaging",
    "none",
    _choice("none", "ema"),
    "'ema': a bias-corrected moving average of the params in the train "
    "state; evals report both, and the run's model is the average. 'none': off",
  ),
  F(
    "averaging_beta",
    0.99,
    _num(0.0, 1.0, lo_open=True, hi_open=True),
    "the average's decay",
    other=0.9,
    unread=_averaging_off,
  ),
)


def default_trainer_config() -> ml_collections.ConfigDict:
  """The `trainer` block at its defaults (`TRAINER_FIELDS`)."""
  return schema.block(TRAINER_FIELDS)


# `hybrid`: the generic controller's (`hybrid.controller`, `hybrid.context.ControllerSettings`).
HYBRID_FIELDS: tuple[schema.Field, ...] = (
  F("enable_predict", True, _bool, "False keeps the trainer in WARMUP/FULL (then it equals the baseline)"),
  F(
    "method",
    "",
    _str,
    "the method of a hybrid run: 'velocity', 'jump', 'outer_momentum', 'selective_backprop', "
    "or the dotted path of a module of your own; '' = the velocity predictor",
  ),
  F("warmup_steps", 50, _int(1), "WARMUP steps (at least 1: the history needs a step), below trainer.steps"),
  F("full_steps", 20, _int(1), "minimum FULL steps before a PREDICT phase may start"),
  F("max_predict_steps", 4, _int(1, 1000), "upper bound of the horizon H"),
  F("confidence_threshold", 0.5, _num(0.0, 1.0), "PREDICT only at confidence >= this"),
  F("correct_steps", 12, _int(1), "CORRECT steps after a PREDICT phase"),
  F("correction_interval", 0, _int(0), "one real step every N predict steps; 0 = off"),
  F(
    "grouping",
    "kind",
    _choice("kind", "leaf", "global"),
    "parameter groups: 'kind' (layer index stripped), 'leaf', 'global'",
  ),
  F(
    "dispatch",
    "switch",
    _choice("host", "switch"),
    "'switch': one fused step, no host sync; 'host': each transition's own jitted function",
  ),
  F(
    "steps_per_call",
    1,
    _int(1),
    "with dispatch='switch': hybrid steps per dispatch (lax.scan when > 1); pick one "
    "that divides the log, eval and checkpoint intervals",
  ),
  F("health.grad_explosion_factor", 10.0, _num(1.0, lo_open=True), "grad norm > baseline EMA x this: FULL cooldown"),
  F(
    "health.loss_spike_sigma",
    6.0,
    _num(0.0, lo_open=True),
    "loss above its EMA by this many running std: FULL cooldown",
  ),
  F("health.max_prediction_failures", 3, _int(1), "consecutive diverged PREDICT phases: FULL cooldown"),
  F("health.cooldown_steps", 50, _int(0), "FULL steps of a cooldown"),
  F(
    "health.max_events",
    50,
    _int(1),
    "stop the run after this many non-finite events in all (TrainingDiverged)",
    runtime="resume",
  ),
)


def default_hybrid_config() -> ml_collections.ConfigDict:
  """Every knob of hybrid training (docs/design.md): the generic controller's (`HYBRID_FIELDS`), and
  the block of each built-in method (`hybrid.velocity`, `hybrid.jump`; `registry.BUILTIN_METHODS`), so
  that any of them can be chosen and tuned from the command line."""
  c = schema.block(HYBRID_FIELDS)
  for name in registry.BUILTIN_METHODS:
    method = registry.load_method(name)
    if method.config_key:
      c[method.config_key] = method.default_config()
  return c


DEFAULT_METHOD = registry.DEFAULT_METHOD  # the method of a hybrid run whose `hybrid.method` is ''.


def method_name(config: ml_collections.ConfigDict | dict) -> str:
  """The method `config` trains in hybrid mode: `hybrid.method`, or `DEFAULT_METHOD` where it names
  none ('' or no `hybrid` block)."""
  return (config.get("hybrid") or {}).get("method") or DEFAULT_METHOD


def resolve_method(config: ml_collections.ConfigDict) -> registry.Method:
  """The method `config` trains (`method_name`); an error naming `--config.hybrid.method` when no
  method loads from it."""
  return registry.load_method(method_name(config))


def with_method_block(
  config: ml_collections.ConfigDict, method: registry.Method | None = None
) -> ml_collections.ConfigDict:
  """`config` with its method's block (`hybrid.<CONFIG_KEY>`) at the method's defaults where the
  config has none (a user's method, whose block a preset cannot know); fields already set win.
  `method`: the config's method, resolved already (`resolve_method`)."""
  if "hybrid" not in config:
    return config
  method = method or resolve_method(config)
  key = method.config_key
  if key:
    block = method.default_config()
    defaults = flatten(block)
    for field, value in flatten(config.hybrid.get(key, {})).items():
      try:  # a field the block does not declare stays, for `validate` to name it
        schema.set_leaf(block, field, value)
      except TypeError as e:
        raise ValueError(
          f"--config.hybrid.{key}.{field}={value!r}: method {method.name!r} declares it as "
          f"{type(defaults[field]).__name__} (default {defaults[field]!r}); give a value of that type"
        ) from e
    with config.unlocked():
      config.hybrid[key] = block
  return config


# `mesh` (`hybridjax.sharding`): `data` x `fsdp` devices; the default spans every visible device on
# the data axis, so a run on 8 devices is 8-way data parallel with no flag. A checkpoint restores onto
# any mesh, so these are runtime fields.
MESH_FIELDS: tuple[schema.Field, ...] = (
  F("data", -1, _int(-1), "data-parallel replicas; -1 = all visible devices / fsdp", runtime="host"),
  F(
    "fsdp", 1, _int(1), "devices each param, optimizer-state and velocity leaf is split over (1 = off)", runtime="host"
  ),
)
# `distributed`: multi-host start-up, `jax.distributed.initialize()` (`hybridjax.sharding`). With
# `enabled` and nothing else set, JAX detects the cluster (SLURM, Open MPI, TPU pods, ...).
DISTRIBUTED_FIELDS: tuple[schema.Field, ...] = (
  F("enabled", False, _bool, "start JAX's multi-host runtime", runtime="host"),
  F("coordinator_address", "", _str, "'host:port' of process 0; '' = auto-detect", runtime="host"),
  F("num_processes", 0, _int(0), "0 = auto-detect", runtime="host"),
  F("process_id", -1, _int(-1), "-1 = auto-detect", runtime="host"),
)
MODE = F("mode", "baseline", _choice("baseline", "hybrid"), "'baseline' (plain optax loop) | 'hybrid'")
# The top level of every config.
TOP_FIELDS: tuple[schema.Field, ...] = (
  MODE,
  F("seed", 0, _int(0), "the run's seed (init, data order, dropout)"),
  F(
    "resume",
    "auto",
    _choice("auto", "force", "never"),
    "'auto': resume a run in the workdir if its config matches, "
    "refuse otherwise; 'force': resume even if the stored config differs; 'never': refuse any existing run",
    runtime="host",
  ),
  F(
    "preset",
    "",
    _str,
    "experiment configs only: the preset and its variants ('tiny,speedrun'), a label: the "
    "values it set are in the other fields",
    runtime="resume",
  ),
  F(
    "notes",
    "",
    _str,
    "experiment configs only: what the preset's settings rest on (printed at the start)",
    runtime="host",
  ),
)
# The blocks every config has, with their declarations (the model and data blocks are a task's own).
BLOCKS: dict[str, tuple[schema.Field, ...]] = {
  "optim": optim_lib.FIELDS,
  "trainer": TRAINER_FIELDS,
  "hybrid": HYBRID_FIELDS,
  "mesh": MESH_FIELDS,
  "distributed": DISTRIBUTED_FIELDS,
}


def default_mesh_config() -> ml_collections.ConfigDict:
  """The `mesh` block at its defaults (`MESH_FIELDS`)."""
  return schema.block(MESH_FIELDS)


def default_distributed_config() -> ml_collections.ConfigDict:
  """The `distributed` block at its defaults (`DISTRIBUTED_FIELDS`)."""
  return schema.block(DISTRIBUTED_FIELDS)


def default_config(mode: str = "baseline", method: str = "") -> ml_collections.ConfigDict:
  """A complete config for `train()` on a task of your own (no `model` or `data` block: your
  `init_params`, `loss_fn` and batches stand for them): `mode`, `seed`, `resume` and the `optim`,
  `trainer`, `hybrid`, `mesh` and `distributed` blocks at their defaults.

  `method` (hybrid mode only): the method to train, a built-in name or your module's dotted path;
  its block (`hybrid.<CONFIG_KEY>`) is added at its defaults, so its fields can be set at once.
  """
  if method and mode != "hybrid":
    raise ValueError(
      f"default_config(mode={mode!r}, method={method!r}): a method trains only in hybrid mode; "
      "pass mode='hybrid', or no method for the plain baseline"
    )
  c = schema.block(f for f in TOP_FIELDS if f.name in ("mode", "seed", "resume"))
  c.mode = mode
  c.optim = default_optim_config()
  c.trainer = default_trainer_config()
  c.hybrid = default_hybrid_config()
  c.mesh = default_mesh_config()
  c.distributed = default_distributed_config()
  if method:
    c.hybrid.method = method
    with_method_block(c)
  c.lock()  # a misspelt key fails at the assignment, with ml_collections' "did you mean"
  return c


def flatten(config: ml_collections.ConfigDict | dict, prefix: str = "") -> dict[str, Any]:
  """{'trainer.steps': 600, ...}: the leaves of a nested config (or its dict) by dotted name.

  The inverse is `ConfigDict.update_from_flattened_dict`.
  """
  flat: dict[str, Any] = {}
  for key, value in config.items():
    name = f"{prefix}{key}"
    if hasattr(value, "items"):
      flat.update(flatten(value, name + "."))
    else:
      flat[name] = value
  return flat
