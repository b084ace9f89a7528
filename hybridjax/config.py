"""Default config blocks and their validation.

Every experiment config has the blocks `model`, `data`, `optim`, `trainer` and `hybrid`. `validate`
checks every field before anything is compiled, and its errors name the field and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable
from typing import Any

import ml_collections

from hybridjax import fields as fields_lib
from hybridjax import optim as optim_lib
from hybridjax import registry
from hybridjax.models import attention, gpt2


def default_optim_config() -> ml_collections.ConfigDict:
  """AdamW with linear warm-up and cosine decay, and global-norm clipping."""
  c = ml_collections.ConfigDict()
  # 'adamw' | 'adam' | 'sgd' (momentum 0.9) | 'muon' (Muon on the hidden matrices, AdamW on
  # embeddings, LayerNorm parameters and biases) | 'muon_groups' (the speedrun's: Muon on the
  # hidden matrices, Adam on embeddings, head and scalars at their own ratios); any other name
  # names an optimizer of the user's, passed to `train(tx=...)` (the fields below that configure the
  # built-ins do not apply to it).
  c.name = "adamw"
  c.learning_rate = 3e-3  # peak lr (for 'muon': of the Muon matrices)
  # 'cosine': warm-up, then cosine decay; 'wsd': warm-up, stable at the peak, then linear decay over
  # the last decay_fraction of the schedule
  c.schedule = "cosine"
  c.warmup_steps = 50  # below trainer.steps, or 0 = none (a warm-up as long as the run is refused)
  c.decay_steps = 0  # 0 = decay over the whole run (trainer.steps)
  c.decay_fraction = 0.2  # 'wsd' only: the fraction of decay_steps spent decaying, in (0, 1]
  c.min_lr_ratio = 0.1  # final lr = learning_rate * min_lr_ratio
  c.weight_decay = 0.1
  c.b1 = 0.9
  c.b2 = 0.95
  c.eps = 1e-8
  c.grad_clip = 1.0  # 0 = no clipping
  # 'adamw' and 'adam' only: the LR of the embeddings (token, positions, value embeddings; a head tied
  # to the token embedding with them) and of an untied output head, as ratios of learning_rate (the
  # groups of 'muon_groups': `hybridjax.optim.muon_group_labels`); 1.0 = every parameter at learning_rate
  c.adamw_embed_lr_ratio = 1.0
  c.adamw_head_lr_ratio = 1.0
  # 'muon' only: the AdamW group's lr = learning_rate * adam_lr_ratio
  c.adam_lr_ratio = 0.15
  c.muon_weight_decay = 0.0  # 'muon' only: the Muon matrices' weight decay (times the lr)
  # 'muon_groups' (the speedrun's optimizer): Muon on the hidden matrices at learning_rate; Adam on
  # the embeddings, the head and the scalars, each at a fixed ratio of it (the speedrun's record:
  # Muon 0.05, embeddings 0.6, head 0.008, scalars 0.04), betas (0.8, 0.95), eps 1e-10
  c.embed_lr_ratio = 12.0
  c.head_lr_ratio = 0.16
  c.scalar_lr_ratio = 0.8
  c.groups_b1 = 0.8
  c.groups_b2 = 0.95
  c.groups_eps = 1e-10
  # 'muon_groups': multiplies every Adam group's ratio (embed, head, scalar, tied) at once
  c.groups_lr_scale = 1.0
  # 'muon_groups', a token embedding tied to the head (no untied head): its Adam settings. These
  # defaults are the head group's, which it shared before it had its own; the records #3-#7 gave it
  # about 0.36 of Muon's rate, betas (0.9, 0.95), eps 1e-8 (the recipe's `muon` step sets those)
  c.tied_lr_ratio = 0.16
  c.tied_b1 = 0.8
  c.tied_b2 = 0.95
  c.tied_eps = 1e-10
  # 'muon' and 'muon_groups': Muon's momentum (optax's default and the records', 0.95), in (0, 1)
  c.muon_momentum = 0.95
  # 'muon' and 'muon_groups': Muon's momentum rises linearly from muon_momentum_start to muon_momentum
  # over this many Muon updates (the records from #9: 0.85 to 0.95 over 500 steps, later 300). 0 = off
  # (muon_momentum throughout)
  c.muon_momentum_warmup_steps = 0
  c.muon_momentum_start = 0.85
  # Outer Nesterov momentum on K-step displacements (baseline mode, or hybrid with the jump
  # predictor, whose drift it then gives): every `outer_every` real steps
  # d = params - slow; m = mu m + d; slow += eta (mu m + d); params = slow. 0 = off.
  c.outer_every = 0
  c.outer_eta = 0.8
  c.outer_mu = 0.75
  return c


def default_trainer_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.steps = 600
  c.batch_size = 16
  c.grad_accum = 1  # micro-batches per optimizer step; must divide batch_size
  c.log_every = 20
  c.eval_every = 100  # 0 = only at the end
  c.eval_batches = 8
  c.checkpoint_every = 200  # 0 = only at the end
  c.max_to_keep = 3
  c.progress = True  # tqdm progress bar
  c.compile_cache = True  # JAX persistent compilation cache
  c.compile_cache_dir = ""  # '' = ~/.cache/hybridjax/jax_cache
  c.memory_limit_bytes = 0  # 0 = off; above it: warn and save an emergency checkpoint once
  # Stop the run (TrainingDiverged) after this many consecutive real steps whose update was skipped
  # as non-finite; the last good checkpoint is kept.
  c.max_nonfinite_steps = 20
  # Weight averaging: 'ema' keeps a bias-corrected moving average of the params in the train state
  # (both modes); every eval reports the raw and the averaged params, and the run's model (the
  # summary's final_eval_loss, what `final_params` returns) is the averaged one. 'none': off.
  c.averaging = "none"
  c.averaging_beta = 0.99
  return c


def default_hybrid_config() -> ml_collections.ConfigDict:
  """Every knob of hybrid training (docs/design.md): the generic controller's, and the block of each
  built-in method (`hybrid.velocity`, `hybrid.jump`; `registry.BUILTIN_METHODS`), so that any of
  them can be chosen and tuned from the command line."""
  c = ml_collections.ConfigDict()
  c.enable_predict = True  # False keeps the trainer in WARMUP/FULL (then it equals the baseline)
  # The training method (`hybridjax.methods`) of a hybrid run: 'velocity' (steps of alpha . velocity
  # planned by the RSSM), 'jump' (one long move along the averaged iterate's drift, chosen by probe
  # forwards), 'outer_momentum' (real steps only), 'selective_backprop' (2B sequences scored, the
  # hardest B backpropagated), or the dotted path of a module of your own. '' = none chosen: the
  # velocity predictor in hybrid mode. A method named in baseline mode is refused (the baseline
  # would train, not the method).
  c.method = ""
  c.warmup_steps = 50  # at least 1 (the history needs a step) and below trainer.steps
  c.full_steps = 20  # minimum FULL steps before a PREDICT phase may start
  c.max_predict_steps = 4  # upper bound of the horizon H
  c.confidence_threshold = 0.5  # PREDICT only at confidence >= this
  c.correct_steps = 12
  c.correction_interval = 0  # one real step every N predict steps; 0 = off
  c.grouping = "kind"  # parameter groups: 'kind' (layer index stripped) | 'leaf' | 'global'
  c.dispatch = "switch"  # 'switch': one fused step, no host sync; 'host': each transition's own jitted function
  # With dispatch='switch': hybrid steps per dispatch (lax.scan when > 1). A dispatch never crosses a
  # log, eval or checkpoint step; pick a K that divides their intervals, or a shorter dispatch
  # compiles a second program.
  c.steps_per_call = 1
  c.health = ml_collections.ConfigDict(
    dict(
      grad_explosion_factor=10.0,  # grad norm > baseline EMA x this -> FULL cooldown
      loss_spike_sigma=6.0,  # loss above its EMA by this many running std -> FULL cooldown
      max_prediction_failures=3,  # consecutive diverged PREDICT phases -> FULL cooldown
      cooldown_steps=50,
      max_events=50,  # stop the run after this many non-finite events in all (TrainingDiverged)
    )
  )
  for name in registry.BUILTIN_METHODS:
    method = registry.load_method(name)
    if method.config_key:
      c[method.config_key] = method.default_config()
  return c


# The method a hybrid run trains when `hybrid.method` names none ('').
DEFAULT_METHOD = "velocity"


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
    given = config.hybrid[key] if key in config.hybrid else {}
    with block.unlocked():
      for field, value in flatten(given).items():
        *parents, leaf = field.split(".")
        node = block
        for p in parents:  # a field the block does not declare stays, for `validate` to name it
          if p not in node:
            node[p] = ml_collections.ConfigDict()
          node = node[p]
        try:
          node[leaf] = value
        except TypeError as e:
          raise ValueError(
            f"--config.hybrid.{key}.{field}={value!r}: method {method.name!r} declares it as "
            f"{type(defaults[field]).__name__} (default {defaults[field]!r}); give a value of that type"
          ) from e
    with config.unlocked():
      config.hybrid[key] = block
  return config


def default_mesh_config() -> ml_collections.ConfigDict:
  """The device mesh (`hybridjax.sharding`): `data` x `fsdp` devices.

  The default spans every visible device on the data axis, so a run on 8 devices is 8-way data
  parallel with no flag. A config without this block gets these defaults.
  """
  c = ml_collections.ConfigDict()
  c.data = -1  # data-parallel replicas; -1 = all visible devices / fsdp
  c.fsdp = 1  # devices each param, optimizer-state and velocity leaf is split over (1 = off)
  return c


def default_distributed_config() -> ml_collections.ConfigDict:
  """Multi-host start-up: `jax.distributed.initialize()` (see `hybridjax.sharding`).

  With `enabled` and nothing else set, JAX detects the cluster (SLURM, Open MPI, TPU pods, ...);
  elsewhere give the coordinator's address and this process's place explicitly.
  """
  c = ml_collections.ConfigDict()
  c.enabled = False
  c.coordinator_address = ""  # 'host:port' of process 0; '' = auto-detect
  c.num_processes = 0  # 0 = auto-detect
  c.process_id = -1  # -1 = auto-detect
  return c


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
  c = ml_collections.ConfigDict()
  c.mode = mode  # 'baseline' (plain optax loop) | 'hybrid'
  c.seed = 0
  # 'auto': resume a run in the workdir if its config matches, refuse otherwise; 'force': resume
  # even if the stored config differs; 'never': refuse any existing run.
  c.resume = "auto"
  c.optim = default_optim_config()
  c.trainer = default_trainer_config()
  c.hybrid = default_hybrid_config()
  c.mesh = default_mesh_config()
  c.distributed = default_distributed_config()
  if method:
    c.hybrid.method = method
    with_method_block(c)
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


# --- validation -------------------------------------------------------------------------------


# The field checks, under the short names the table below uses.
_int = fields_lib.check_int
_num = fields_lib.check_num
_int_tuple = fields_lib.check_int_tuple
_num_tuple = fields_lib.check_num_tuple
_choice = fields_lib.check_choice
_bool = fields_lib.check_bool
_str = fields_lib.check_str
_name = fields_lib.check_name
_is_int = fields_lib.is_int
_is_num = fields_lib.is_num


_FIELDS: dict[str, Callable[[Any], str | None]] = {
  "preset": _str,  # experiment configs only; the experiment checks the name itself
  "notes": _str,  # experiment configs only: what the preset's settings rest on (printed at the start)
  "mode": _choice("baseline", "hybrid"),
  "seed": _int(0),
  "resume": _choice("auto", "force", "never"),
  "model.vocab_size": _int(2, 65535),
  "model.n_ctx": _int(1),
  "model.n_layer": _int(1),
  "model.n_head": _int(1),
  "model.d_model": _int(1),
  "model.dropout": _num(0.0, 1.0, hi_open=True),
  "model.layer_norm_eps": _num(0.0, lo_open=True),
  "model.dtype": _choice("float32", "bfloat16", "float16"),
  "model.attention": _choice(*attention.ATTENTIONS),  # its combinations: `models.gpt2.option_errors`
  "model.loss_chunk": _int(0),
  # The speedrun's architecture options (`models.gpt2.OPTIONS`; their combinations are checked below).
  "model.rotary": _bool,
  "model.rotary_base": _num(1.0, lo_open=True),
  "model.qk_norm": _bool,
  "model.relu2": _bool,
  "model.rmsnorm": _bool,
  "model.embed_norm": _bool,
  "model.zero_init_proj": _bool,
  "model.untied_head": _bool,
  "model.logit_softcap": _num(0.0),
  "model.embed_skips": _bool,
  "model.value_embeds": _int(0),
  "model.unet_skips": _bool,
  "model.value_residual": _bool,
  "model.attn_scale": _num(0.0),  # 0 = 1/sqrt(head_dim)
  "model.learned_attn_scale": _choice(*gpt2.LEARNED_ATTN_SCALES),
  "model.init": _choice(*gpt2.INITS),
  "data.path": _str,
  "data.tokenizer": _choice("byte", "gpt2"),
  "data.cache_dir": _str,
  "data.val_fraction": _num(0.0, 0.5, lo_open=True),
  # A built-in optimizer ('adamw', 'adam', 'sgd', 'muon'), or the name of one passed to `train(tx=...)`.
  "optim.name": _name,
  "optim.learning_rate": _num(0.0, lo_open=True),
  "optim.schedule": _choice("cosine", "wsd"),
  "optim.warmup_steps": _int(0),
  "optim.decay_steps": _int(0),
  "optim.decay_fraction": _num(0.0, 1.0, lo_open=True),
  "optim.min_lr_ratio": _num(0.0, 1.0),
  "optim.weight_decay": _num(0.0),
  "optim.b1": _num(0.0, 1.0, hi_open=True),
  "optim.b2": _num(0.0, 1.0, hi_open=True),
  "optim.eps": _num(0.0, lo_open=True),
  "optim.grad_clip": _num(0.0),
  "optim.adamw_embed_lr_ratio": _num(0.0, lo_open=True),
  "optim.adamw_head_lr_ratio": _num(0.0, lo_open=True),
  "optim.adam_lr_ratio": _num(0.0, lo_open=True),
  "optim.muon_weight_decay": _num(0.0),
  "optim.embed_lr_ratio": _num(0.0, lo_open=True),
  "optim.head_lr_ratio": _num(0.0, lo_open=True),
  "optim.scalar_lr_ratio": _num(0.0, lo_open=True),
  "optim.groups_b1": _num(0.0, 1.0, hi_open=True),
  "optim.groups_b2": _num(0.0, 1.0, hi_open=True),
  "optim.groups_eps": _num(0.0, lo_open=True),
  "optim.groups_lr_scale": _num(0.0, lo_open=True),
  "optim.tied_lr_ratio": _num(0.0, lo_open=True),
  "optim.tied_b1": _num(0.0, 1.0, hi_open=True),
  "optim.tied_b2": _num(0.0, 1.0, hi_open=True),
  "optim.tied_eps": _num(0.0, lo_open=True),
  "optim.muon_momentum": _num(0.0, 1.0, lo_open=True, hi_open=True),
  "optim.muon_momentum_warmup_steps": _int(0),
  "optim.muon_momentum_start": _num(0.0, 1.0, hi_open=True),
  "optim.outer_every": _int(0),
  "optim.outer_eta": _num(0.0, 2.0, lo_open=True),
  "optim.outer_mu": _num(0.0, 1.0, hi_open=True),
  "trainer.steps": _int(1),
  "trainer.batch_size": _int(1),
  "trainer.grad_accum": _int(1),
  "trainer.log_every": _int(1),
  "trainer.eval_every": _int(0),
  "trainer.eval_batches": _int(1),
  "trainer.checkpoint_every": _int(0),
  "trainer.max_to_keep": _int(1),
  "trainer.progress": _bool,
  "trainer.compile_cache": _bool,
  "trainer.compile_cache_dir": _str,
  "trainer.memory_limit_bytes": _int(0),
  "trainer.max_nonfinite_steps": _int(1),
  "trainer.averaging": _choice("none", "ema"),
  "trainer.averaging_beta": _num(0.0, 1.0, lo_open=True, hi_open=True),
  "hybrid.enable_predict": _bool,
  # '' (none: the velocity predictor in hybrid mode), a built-in method or the dotted path of a module
  # (`registry.load_method`).
  "hybrid.method": _str,
  "hybrid.warmup_steps": _int(1),
  "hybrid.full_steps": _int(1),
  "hybrid.max_predict_steps": _int(1, 1000),
  "hybrid.confidence_threshold": _num(0.0, 1.0),
  "hybrid.correct_steps": _int(1),
  "hybrid.correction_interval": _int(0),
  "hybrid.grouping": _choice("kind", "leaf", "global"),
  "hybrid.steps_per_call": _int(1),
  "hybrid.dispatch": _choice("host", "switch"),
  "hybrid.health.grad_explosion_factor": _num(1.0, lo_open=True),
  "hybrid.health.loss_spike_sigma": _num(0.0, lo_open=True),
  "hybrid.health.max_prediction_failures": _int(1),
  "hybrid.health.cooldown_steps": _int(0),
  "hybrid.health.max_events": _int(1),
  "mesh.data": _int(-1),  # -1 = auto; 0 is refused by `_mesh_errors`
  "mesh.fsdp": _int(1),
  "distributed.enabled": _bool,
  "distributed.coordinator_address": _str,
  "distributed.num_processes": _int(0),
  "distributed.process_id": _int(-1),
}


def _get(config: ml_collections.ConfigDict, dotted: str) -> Any:
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


def validate(
  config: ml_collections.ConfigDict, *, blocks: tuple[str, ...] | None = None, method: registry.Method | None = None
) -> None:
  """Checks every known field of `config`; raises `ValueError` naming each bad field.

  Args:
    config: the experiment config.
    blocks: check only fields under these top-level keys (default: all present).
    method: the config's method, resolved already (default: loaded from `hybrid.method`).
  """
  errors = []
  for name, check in _FIELDS.items():
    top = name.split(".")[0]
    if blocks is not None and top not in blocks:
      continue
    try:
      value = _get(config, name)
    except (KeyError, AttributeError):
      if top in config:  # a block that is present must be complete
        errors.append(f"--config.{name} is missing from the config")
      continue
    msg = check(value)
    if msg:
      errors.append(f"--config.{name} {msg}")

  def rel(cond: bool, msg: str):
    if not cond:
      errors.append(msg)

  method_set = (config.get("hybrid") or {}).get("method") or ""
  if (blocks is None or "hybrid" in blocks) and config.get("mode") == "baseline" and method_set:
    errors.append(
      f"--config.hybrid.method={method_set!r} is set but --config.mode='baseline' trains the plain baseline, "
      f"not the method: set --config.mode=hybrid to train {method_set!r}, or --config.hybrid.method='' for the "
      "baseline (outer momentum in baseline mode is --config.optim.outer_every)"
    )
  if not errors:
    try:
      resolved = method or resolve_method(config)
    except ValueError:
      resolved = None  # the method's own error comes from `method_errors` below
    errors += unknown_field_errors(config, resolved, blocks=blocks)
  if blocks is None and config.get("mode") == "hybrid" and "hybrid" not in config:
    errors.append(
      "--config.hybrid is missing: --config.mode=hybrid needs the hybrid block "
      "(hybridjax.config.default_hybrid_config())"
    )
  if not errors:
    if "trainer" in config and (blocks is None or "trainer" in blocks):
      t = config.trainer
      rel(
        t.batch_size % t.grad_accum == 0,
        f"--config.trainer.batch_size ({t.batch_size}) must be divisible by "
        f"--config.trainer.grad_accum ({t.grad_accum})",
      )
      if blocks is None and config.get("mode") == "hybrid" and "hybrid" in config and config.hybrid.enable_predict:
        # Otherwise the whole run is WARMUP: a baseline run with extra cost.
        rel(
          config.hybrid.warmup_steps < t.steps,
          f"--config.hybrid.warmup_steps ({config.hybrid.warmup_steps}) must be < "
          f"--config.trainer.steps ({t.steps}) for a hybrid run to ever predict; lower "
          "--config.hybrid.warmup_steps or use --config.mode=baseline",
        )
    if "optim" in config and (blocks is None or "optim" in blocks):
      o = config.optim
      rel(
        o.decay_steps == 0 or o.decay_steps > o.warmup_steps,
        f"--config.optim.decay_steps ({o.decay_steps}) must be 0 (decay over the whole run) or "
        f"> --config.optim.warmup_steps ({o.warmup_steps})",
      )
      steps = config.get("trainer", {}).get("steps")
      # A warm-up as long as the run never reaches the peak learning rate, nor decays: a run of a few
      # steps with the default warm-up is a mistake, not a run.
      if steps is not None and o.warmup_steps and o.warmup_steps >= steps:
        fix = f"below {steps} (e.g. {max(steps // 10, 1)}), or 0 for no warm-up" if steps > 1 else "to 0"
        errors.append(
          f"--config.optim.warmup_steps ({o.warmup_steps}) is at least the run's length (--config.trainer.steps="
          f"{steps}): the learning rate would never reach its peak --config.optim.learning_rate nor decay; set "
          f"--config.optim.warmup_steps {fix}"
        )
      # The optimizer-specific knobs: set away from their defaults with another optimizer they would be
      # silently ignored.
      ratios = optim_lib.adamw_lr_ratios(o)
      if ratios != (1.0, 1.0) and o.name not in ("adamw", "adam"):
        errors.append(optim_lib.adamw_ratio_error(o.name, ratios))
      final = optim_lib.final_muon_momentum(o)
      rel(
        final == optim_lib.MUON_MOMENTUM or o.name in ("muon", "muon_groups"),
        f"--config.optim.muon_momentum ({final}) is Muon's momentum, but --config.optim.name={o.name!r} has no "
        f"Muon: set --config.optim.name to 'muon' or 'muon_groups', or the momentum back to {optim_lib.MUON_MOMENTUM}",
      )
      scale = float(o.get("groups_lr_scale", 1.0))
      rel(
        scale == 1.0 or o.name == "muon_groups",
        f"--config.optim.groups_lr_scale ({scale}) scales the Adam groups of 'muon_groups', but --config.optim.name="
        f"{o.name!r}: set --config.optim.name='muon_groups', or the scale back to 1.0",
      )
      warm = o.get("muon_momentum_warmup_steps", 0)
      if warm:  # Muon's momentum warm-up: a Muon optimizer, and a run it fits in
        rel(
          o.name in ("muon", "muon_groups"),
          f"--config.optim.muon_momentum_warmup_steps ({warm}) warms up Muon's momentum, but --config.optim.name="
          f"{o.name!r} has no Muon: set --config.optim.name to 'muon' or 'muon_groups', or the warm-up to 0",
        )
        rel(
          steps is None or warm <= steps,
          f"--config.optim.muon_momentum_warmup_steps ({warm}) is longer than the run (--config.trainer.steps="
          f"{steps}): the momentum would never reach --config.optim.muon_momentum ({final}); use at most {steps} "
          "steps, or 0 for no warm-up",
        )
        rel(
          o.muon_momentum_start <= final,
          f"--config.optim.muon_momentum_start ({o.muon_momentum_start}) is above --config.optim.muon_momentum "
          f"({final}): the warm-up rises from the start to the momentum; set the start at most {final}, or "
          "--config.optim.muon_momentum_warmup_steps=0 for no warm-up",
        )
    if "model" in config and (blocks is None or "model" in blocks):
      m = config.model
      rel(
        m.d_model % m.n_head == 0,
        f"--config.model.d_model ({m.d_model}) must be divisible by --config.model.n_head ({m.n_head})",
      )
      # The speedrun's architecture options, alone and in combination (`models.gpt2.OPTIONS`).
      errors += [f"--config.{e}" for e in gpt2.option_errors(m.to_dict())]
    if "hybrid" in config and (blocks is None or "hybrid" in blocks):
      h = config.hybrid
      rel(
        h.steps_per_call == 1 or h.dispatch == "switch",
        f"--config.hybrid.steps_per_call ({h.steps_per_call}) > 1 needs --config.hybrid.dispatch="
        "'switch' (host dispatch reads the device after every step); set one or the other",
      )
      errors += method_errors(config, check_relations=blocks is None, method=method)
    if blocks is None or "mesh" in blocks or "distributed" in blocks:
      errors += _mesh_errors(config, n_devices=None)[0]
  if errors:
    raise ValueError("invalid config:\n  " + "\n  ".join(errors))


# The blocks of an experiment config whose every field is declared (`_FIELDS`, a method's block,
# the GPT-2 model's fields); a misspelt key in them is an error, not a new field.
DECLARED_BLOCKS = ("model", "data", "optim", "trainer", "hybrid", "mesh", "distributed")
# Blocks that other code checks field by field (the benchmark's, `bench.specs.validate_benchmark`).
OTHER_BLOCKS = ("benchmark",)


def declared_fields(method: registry.Method | None = None) -> set[str]:
  """Every field an experiment config may hold in `DECLARED_BLOCKS` and at its top level: the
  validated ones (`known_fields`: the generic fields and the built-in methods' blocks), the GPT-2
  model's, and `method`'s block (a user's method: its declared fields, or its defaults' leaves)."""
  names = set(known_fields()) | {f"model.{f.name}" for f in dataclasses.fields(gpt2.GPT2Config)}
  if method is not None and method.config_key:
    block = set(method.fields)
    default = method.default_config()
    if default is not None:
      block |= set(flatten(default))
    names |= {f"hybrid.{method.config_key}.{f}" for f in block}
  return names


def unknown_field_errors(
  config: ml_collections.ConfigDict, method: registry.Method | None = None, *, blocks: tuple[str, ...] | None = None
) -> list[str]:
  """A line for each key of `config` that is no declared field (`declared_fields`), naming it and
  the nearest valid one: a misspelt key set from Python (`config.trainer.stepz = 50`) would
  otherwise train on the default, without a word. A block of the config's own outside
  `DECLARED_BLOCKS` (a task's, e.g. `mlp`) and `OTHER_BLOCKS` are left to their owners."""
  known = declared_fields(method)
  errors = []
  for name in flatten(config):
    top = name.split(".")[0]
    if name in known or top in OTHER_BLOCKS or (blocks is not None and top not in blocks):
      continue
    near_block = difflib.get_close_matches(top, DECLARED_BLOCKS + OTHER_BLOCKS, n=1, cutoff=0.8)
    if "." in name and top not in DECLARED_BLOCKS and not near_block:
      continue  # a block of the config's own (a task's, e.g. `mlp`), not a misspelt declared one
    nearest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    if not nearest:  # a misspelt block name (`trainr.steps`): the nearest field of the nearest block
      parts = name.split(".")
      blocks_near = difflib.get_close_matches(parts[0], DECLARED_BLOCKS, n=1)
      if blocks_near:
        nearest = difflib.get_close_matches(".".join([blocks_near[0], *parts[1:]]), sorted(known), n=1, cutoff=0.5)
    hint = f"did you mean --config.{nearest[0]}? " if nearest else "(docs/config.md lists the fields) "
    errors.append(
      f"--config.{name} is not a field of the config: {hint}A misspelt key would leave the field it "
      "meant at its default; rename or remove it"
    )
  return errors


def method_errors(
  config: ml_collections.ConfigDict, *, check_relations: bool = True, method: registry.Method | None = None
) -> list[str]:
  """The problems of `config.hybrid`'s method: a name that loads no method, its block's fields
  (`method.fields`), and, with `check_relations` in a hybrid run, its checks on the whole config
  (`method.check`) and what it composes with (outer momentum runs with a method only if the method
  declares it in `COMPOSES_WITH`). Each names the field and the fix."""
  h = config.hybrid
  name = method_name(config)
  try:
    method = method or registry.load_method(name)
  except ValueError as e:
    return [str(e)]
  errors = []
  key = method.config_key
  if key:
    if key not in h:
      return [
        f"--config.hybrid.{key} is missing: method {name!r} reads its settings there "
        f"(hybridjax.config.with_method_block(config) adds its defaults)"
      ]
    for field, check in method.fields.items():
      try:
        value = _get(h[key], field)
      except (KeyError, AttributeError):
        errors.append(f"--config.hybrid.{key}.{field} is missing from the config")
        continue
      msg = check(value)
      if msg:
        errors.append(f"--config.hybrid.{key}.{field} {msg}")
  if errors or not check_relations or config.get("mode") != "hybrid":
    return errors
  if method.advances_schedule and h.steps_per_call != 1:
    errors.append(
      f"--config.hybrid.method={name!r} decides on the device whether a step uses its batch and how far it "
      "advances the schedule, so the host reads the data position after each step: set "
      f"--config.hybrid.steps_per_call=1 (got {h.steps_per_call})"
    )
  outer_every = config.get("optim", {}).get("outer_every", 0)
  if outer_every and "outer_momentum" not in method.composes_with and name != "outer_momentum":
    errors.append(
      f"--config.optim.outer_every ({outer_every}) turns on outer momentum, which method {name!r} does not "
      "compose with (its COMPOSES_WITH): set --config.optim.outer_every=0, or --config.mode=baseline"
    )
  return errors + list(method.check(config))


def field_defaults() -> dict[str, Any]:
  """The default of every field (as its JSON record holds it): `default_config`'s, the built-in
  methods' blocks and the GPT-2 model's. What a field missing from an older run's saved config meant."""
  defaults = flatten(json.loads(default_config().to_json()))
  for f in dataclasses.fields(gpt2.GPT2Config):
    if f.default is not dataclasses.MISSING:
      defaults[f"model.{f.name}"] = json.loads(json.dumps(f.default))
  return defaults


def known_fields() -> dict[str, Callable[[Any], str | None]]:
  """Every validated field: the generic ones and those of the built-in methods' blocks."""
  fields = dict(_FIELDS)
  for name in registry.BUILTIN_METHODS:
    method = registry.load_method(name)
    for field, check in method.fields.items():
      fields[f"hybrid.{method.config_key}.{field}"] = check
  return fields


def _mesh_errors(config: ml_collections.ConfigDict, n_devices: int | None) -> tuple[list[str], int, int]:
  """(errors, data, fsdp) for `config.mesh` on `n_devices` devices (None: not known yet).

  Validation runs before JAX starts (multi-host start-up must come first), so it checks only what
  the config alone decides; `mesh_shape` repeats the checks with the real device count.
  """
  mesh = config.get("mesh") or default_mesh_config()
  data, fsdp = mesh.get("data", -1), mesh.get("fsdp", 1)
  errors = []
  if data == 0:
    errors.append("--config.mesh.data must be >= 1, or -1 for all devices, got 0")
    return errors, data, fsdp
  if n_devices is not None:
    if data == -1:
      if n_devices % fsdp:
        errors.append(
          f"--config.mesh.fsdp ({fsdp}) must divide the number of devices "
          f"({n_devices}); set --config.mesh.fsdp to a divisor of {n_devices}"
        )
        return errors, data, fsdp
      data = n_devices // fsdp
    elif data * fsdp != n_devices:
      errors.append(
        f"--config.mesh.data ({data}) x --config.mesh.fsdp ({fsdp}) = {data * fsdp} must equal "
        f"the number of devices ({n_devices}); set --config.mesh.data=-1 to use them all"
      )
      return errors, data, fsdp
  if data > 0 and "trainer" in config:
    t = config.trainer
    n = data * fsdp * t.grad_accum
    if t.batch_size % n:
      errors.append(
        f"--config.trainer.batch_size ({t.batch_size}) must be divisible by mesh.data ({data}) x "
        f"mesh.fsdp ({fsdp}) x trainer.grad_accum ({t.grad_accum}) = {n}, so every device gets "
        f"an equal share of each micro-batch; use a multiple of {n}"
      )
  dist = config.get("distributed")
  if dist is not None:
    address, enabled = dist.get("coordinator_address", ""), dist.get("enabled", False)
    n_proc, proc_id = dist.get("num_processes", 0), dist.get("process_id", -1)
    if address and not enabled:
      errors.append(
        "--config.distributed.coordinator_address is set but "
        "--config.distributed.enabled is False; set it to True for a multi-host run"
      )
    if n_proc > 0 and proc_id >= n_proc:
      errors.append(
        f"--config.distributed.process_id ({proc_id}) must be < --config.distributed.num_processes ({n_proc})"
      )
  return errors, data, fsdp


def mesh_shape(config: ml_collections.ConfigDict, n_devices: int) -> tuple[int, int]:
  """The (data, fsdp) mesh shape `config.mesh` asks for on `n_devices` devices.

  Raises:
    ValueError: naming the field and the fix, when the shape does not cover exactly `n_devices`
      devices or `trainer.batch_size` does not split evenly over them.
  """
  errors, data, fsdp = _mesh_errors(config, n_devices)
  if errors:
    raise ValueError("invalid config:\n  " + "\n  ".join(errors))
  return data, fsdp
