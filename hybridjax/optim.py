"""The optimizer layer: what a plain optax loop carries and does, as pure functions.

This module imports nothing else from hybridjax; the hybrid algorithm (`hybridjax.hybrid`) and the
host loop (`hybridjax.loop`) are built on it.

* `TrainState` and its init/next functions.
* `Schedule`: the learning-rate schedule (cosine or WSD) as runtime arrays (peak LR, warm-up,
  length, floor, start of the decay); only its kind is static. The
  learning rate is `learning_rate(schedule, step)` of the *global* step and is injected into the
  optimizer state before each update (optax's public `inject_hyperparams` state), so hybrid
  training, whose predicted steps consume schedule time without an optimizer update, keeps the
  baseline's schedule; and since nothing about the schedule is a compile-time constant, one
  compiled step serves every learning rate and budget of a sweep.
* `make_optimizer` (AdamW, Adam, SGD, or Muon on the hidden matrices: `muon_labels`),
  `loss_and_grads`, `guarded_update` (skips a non-finite update), `global_norm`, `tree_where`,
  `all_finite`, and the baseline `train_step`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import flax
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax

LossFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, Any]]
"""(params, batch) -> (mean loss, aux)."""
Batch = Mapping[str, Any]


@flax.struct.dataclass
class Averaging:
  """A bias-corrected exponential moving average of the params.

  After n averaged steps `params` is sum_i w_i theta_i with w_i proportional to beta^(n-i): the
  same weights as an EMA started at zero and divided by (1 - beta^n), as Adam corrects its
  moments. So the average never holds the initial params, whatever the run's length.
  """

  params: Any  # float32, the shape of the params
  beta: jax.Array  # float32 scalar


@flax.struct.dataclass
class OuterMomentum:
  """Outer Nesterov momentum on the displacement of every `every` real steps (SNOO-style).

  At each outer step d = θ − slow, m ← μ·m + d, slow ← slow + η·(μ·m + d), θ ← slow; the inner
  optimizer's state is kept. With μ = 0 and η = 1 it leaves θ exactly as the inner optimizer left
  it: the step is written as θ + (η − 1)·d + η·μ·m, which adds exact zeros then.
  """

  slow: Any  # the params after the last outer step (float32, the params' shape)
  momentum: Any  # m, the params' shape
  every: jax.Array  # int32: K, real steps between outer steps
  eta: jax.Array  # float32: the outer learning rate
  mu: jax.Array  # float32: the outer momentum


def init_outer_momentum(params: Any, every: int, eta: float, mu: float) -> OuterMomentum:
  """Outer momentum starting from `params`, with zero momentum."""
  if int(every) < 1:
    raise ValueError(f"outer momentum needs every >= 1 steps, got {every}")
  return OuterMomentum(
    slow=jax.tree.map(lambda p: jnp.array(p, copy=True), params),
    momentum=jax.tree.map(jnp.zeros_like, params),
    every=jnp.asarray(int(every), jnp.int32),
    eta=jnp.asarray(float(eta), jnp.float32),
    mu=jnp.asarray(float(mu), jnp.float32),
  )


def outer_momentum_step(
  outer: OuterMomentum, params: Any, step: jax.Array, applied: jax.Array | bool = True
) -> tuple[OuterMomentum, Any]:
  """(outer state, params) after real step number `step` (>= 1): an outer step when `every`
  divides it and the step's update was `applied` (a step skipped as non-finite never triggers
  one), else both unchanged. Elementwise selects, not a conditional: the donated buffers are
  updated in place."""
  now = ((step % outer.every) == 0) & jnp.asarray(applied)
  eta, mu = outer.eta, outer.mu
  d = jax.tree.map(lambda p, s: p - s, params, outer.slow)
  m = jax.tree.map(lambda m0, di: mu * m0 + di, outer.momentum, d)
  moved = jax.tree.map(lambda p, di, mi: p + (eta - 1.0) * di + (eta * mu) * mi, params, d, m)
  new_params = tree_where(now, moved, params)
  new_outer = outer.replace(slow=tree_where(now, moved, outer.slow), momentum=tree_where(now, m, outer.momentum))
  return new_outer, new_params


@flax.struct.dataclass
class TrainState:
  """What a plain optax loop carries, plus its health counters."""

  params: Any
  opt_state: Any
  step: jax.Array  # int32 scalar: the global step (batches consumed), which the schedule follows
  # Real steps whose update was skipped because the loss or the gradient was not finite. They live
  # on the device, so the host loop reads them only when it logs (no per-step sync).
  nonfinite_streak: jax.Array  # int32: consecutive skipped steps up to now (0 after a good one)
  nonfinite_total: jax.Array  # int32: all skipped steps
  # Weight averaging (`trainer.averaging='ema'`): an exponential moving average of the params over
  # global steps, or None when averaging is off. Evaluating it is free and worth hundreds of steps
  # at a high learning rate, so it is part of the state: donated, checkpointed, sharded like the params.
  averaging: Averaging | None = None
  # Outer momentum (`optim.outer_every` > 0): Nesterov momentum on K-step displacements, or None.
  outer: OuterMomentum | None = None


@flax.struct.dataclass
class Schedule:
  """Linear warm-up to `peak_lr`, then a decay to `peak_lr * min_lr_ratio` at `decay_steps`:

  * `kind='cosine'`: cosine decay from the end of the warm-up.
  * `kind='wsd'` (warm-up, stable, decay): constant at `peak_lr` until `decay_start`, then linear
    decay to the floor.

  Every field but `kind` is a device scalar, so a step compiled once serves every schedule of a kind.
  """

  peak_lr: jax.Array  # float32
  warmup_steps: jax.Array  # int32
  decay_steps: jax.Array  # int32: the schedule's length (the end of the decay)
  min_lr_ratio: jax.Array  # float32
  # int32: where the decay begins ('wsd'; 'cosine' decays from warmup_steps). None = warmup_steps.
  decay_start: jax.Array | None = None
  kind: str = flax.struct.field(pytree_node=False, default="cosine")  # 'cosine' | 'wsd'


def make_schedule(optim: Any, total_steps: int) -> Schedule:
  """The `Schedule` of an optim config block (`schedule`, `learning_rate`, `warmup_steps`,
  `decay_steps` (0 = `total_steps`), `min_lr_ratio`, `decay_fraction`) for a run of `total_steps`.

  'wsd' decays over the last `round(decay_fraction * decay_steps)` steps (at least one, so the
  floor is reached at `decay_steps`), never into the warm-up.
  """
  kind = optim.get("schedule", "cosine")
  if kind not in ("cosine", "wsd"):
    raise ValueError(f"--config.optim.schedule must be 'cosine' or 'wsd', got {kind!r}")
  decay_steps = int(optim.decay_steps) or int(total_steps)
  warmup = min(int(optim.warmup_steps), max(decay_steps - 1, 0))
  decay_steps = max(decay_steps, warmup + 1)
  decay_start = warmup
  if kind == "wsd":
    decay_start = max(warmup, decay_steps - max(round(float(optim.decay_fraction) * decay_steps), 1))
  return Schedule(
    peak_lr=jnp.asarray(float(optim.learning_rate), jnp.float32),
    warmup_steps=jnp.asarray(warmup, jnp.int32),
    decay_steps=jnp.asarray(decay_steps, jnp.int32),
    min_lr_ratio=jnp.asarray(float(optim.min_lr_ratio), jnp.float32),
    decay_start=jnp.asarray(decay_start, jnp.int32),
    kind=kind,
  )


def learning_rate(schedule: Schedule, step: jax.Array) -> jax.Array:
  """The learning rate at global `step` (float32): warm-up from 0, then the decay of
  `schedule.kind` to the floor (cosine; or 'wsd': stable at the peak, then linear).

  The cosine arithmetic is `optax.warmup_cosine_decay_schedule`'s, operation for operation, so the
  same schedule as compile-time constants and as runtime values gives the same bits.
  """
  step = jnp.asarray(step, jnp.int32)
  peak, warmup = schedule.peak_lr, schedule.warmup_steps
  # Warm-up: optax.linear_schedule(0, peak, warmup).
  count = jnp.clip(step, 0, warmup)
  warm = (0.0 - peak) * (1 - count / jnp.maximum(warmup, 1)) + peak
  warm = jnp.where(warmup > 0, warm, peak)  # no warm-up: a constant schedule at the peak
  if schedule.kind == "wsd":
    return jnp.where(step < warmup, warm, _wsd_after_warmup(schedule, step))
  if schedule.kind != "cosine":
    raise ValueError(f"Schedule.kind must be 'cosine' or 'wsd', got {schedule.kind!r}")
  # Decay: optax.cosine_decay_schedule(peak, decay_steps - warmup, alpha=min_lr_ratio).
  decay_steps = (schedule.decay_steps - warmup).astype(jnp.float32)
  count = jnp.minimum((step - warmup).astype(jnp.float32), decay_steps)
  cosine_decay = 0.5 * (1 + jnp.cos(jnp.pi * count / decay_steps))
  alpha = schedule.min_lr_ratio
  cosine = peak * ((1 - alpha) * cosine_decay + alpha)
  return jnp.where(step < warmup, warm, cosine)


def _wsd_after_warmup(schedule: Schedule, step: jax.Array) -> jax.Array:
  """WSD past the warm-up: the peak until `decay_start`, then linear to `peak * min_lr_ratio` at
  `decay_steps`, and the floor after it."""
  peak, alpha = schedule.peak_lr, schedule.min_lr_ratio
  start = schedule.warmup_steps if schedule.decay_start is None else schedule.decay_start
  length = jnp.maximum(schedule.decay_steps - start, 1).astype(jnp.float32)
  frac = jnp.clip((step - start).astype(jnp.float32) / length, 0.0, 1.0)  # 0 -> 1 over the decay
  linear = peak * ((1 - alpha) * (1 - frac) + alpha)  # exactly the floor at frac = 1
  return jnp.where(step < start, peak, linear)


def _keys(path: Any) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def muon_labels(params: Any) -> Any:
  """'muon' for the hidden matrices, 'adamw' for the rest: a pytree like `params` of labels.

  Muon orthogonalises 2-D updates, which suits the hidden (attention and MLP) matrices only; as in
  the modded-nanogpt recipes, embeddings (any leaf under a key named `embedding`, which includes a
  head tied to the token embedding), an untied head (`lm_head`), LayerNorm parameters and biases
  (every leaf with ndim != 2) stay on AdamW.
  """

  def label(path, p):
    keys = _keys(path)
    return "muon" if p.ndim == 2 and "embedding" not in keys and keys[0] != "lm_head" else "adamw"

  return jax.tree_util.tree_map_with_path(label, params)


def muon_group_labels(params: Any, tied_label: str = "head") -> Any:
  """The speedrun's parameter groups, a pytree like `params` of labels:

  * 'muon': the hidden matrices; 'muon_qkv': a fused query-key-value matrix (`c_attn`), which Muon
    orthogonalises as its three (d, d) blocks, as it would separate q, k and v projections;
  * 'embed': the embedding tables (token, positions, value embeddings);
  * 'head': the output head, `lm_head`; a token embedding tied to the head is labelled `tied_label`
    ('head', or 'tied_head' when it has settings of its own: `tied_head_settings`);
  * 'scalar': every leaf with ndim != 2 (biases, norm scales, the learned mixing scalars).
  """
  tied = "lm_head" not in params

  def label(path, p):
    keys = _keys(path)
    if "embedding" in keys:
      return tied_label if tied and keys[0] == "wte" else "embed"
    if keys[0] == "lm_head":
      return "head"
    if p.ndim != 2:
      return "scalar"
    return "muon_qkv" if keys[-2:] == ("c_attn", "kernel") else "muon"

  return jax.tree_util.tree_map_with_path(label, params)


def _blocks_of_three(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner` applied to each (d, 3d) matrix seen as a batch of three (d, d) matrices (its q, k and
  v column blocks), and the result laid out as (d, 3d) again."""
  to = lambda x: x.reshape(x.shape[0], 3, x.shape[1] // 3).transpose(1, 0, 2)
  back = lambda x: x.transpose(1, 0, 2).reshape(x.shape[1], 3 * x.shape[2])

  def init(params):
    return inner.init(jax.tree.map(to, params))

  def update(updates, state, params=None):
    params = None if params is None else jax.tree.map(to, params)
    updates, state = inner.update(jax.tree.map(to, updates), state, params)
    return jax.tree.map(back, updates), state

  return optax.GradientTransformation(init, update)


def _muon_batched(learning_rate: Any) -> optax.GradientTransformation:
  """`optax.contrib.muon` on (3, d, d) stacks: axis 0 a batch, orthogonalised over axes 1 and 2."""
  dims = optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=2)
  return optax.contrib.muon(
    learning_rate=learning_rate, muon_weight_dimension_numbers=lambda p: jax.tree.map(lambda _: dims, p)
  )


def _muon(learning_rate: Any, weight_decay: Any) -> optax.GradientTransformation:
  """`optax.contrib.muon` with only these two hyperparameters (the rest: optax's defaults, beta
  0.95, Nesterov, 5 Newton-Schulz steps), so `inject_hyperparams` injects no others (an injected
  `ns_steps` would be a traced array)."""
  return optax.contrib.muon(learning_rate=learning_rate, weight_decay=weight_decay)


def _muon_with_momentum(learning_rate: Any, weight_decay: Any, beta: Any) -> optax.GradientTransformation:
  """`_muon` with its momentum `beta` a hyperparameter too (injected only with a momentum warm-up, so
  that without one the optimizer state keeps its earlier layout)."""
  return optax.contrib.muon(learning_rate=learning_rate, weight_decay=weight_decay, beta=beta)


def _muon_batched_with_momentum(learning_rate: Any, beta: Any) -> optax.GradientTransformation:
  """`_muon_batched` with its momentum `beta` a hyperparameter."""
  dims = optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=2)
  return optax.contrib.muon(
    learning_rate=learning_rate, beta=beta, muon_weight_dimension_numbers=lambda p: jax.tree.map(lambda _: dims, p)
  )


MUON_MOMENTUM = 0.95
"""Muon's momentum by default (optax's default, the records'): `optim.muon_momentum`'s default."""


def final_muon_momentum(optim: Any) -> float:
  """Muon's momentum, `optim.muon_momentum` (where a warm-up ends); a block written before the field
  existed gives `MUON_MOMENTUM`, which it trained with."""
  return float(optim.get("muon_momentum", MUON_MOMENTUM))


def muon_momentum(optim: Any) -> Callable[[jax.Array], jax.Array] | float | None:
  """Muon's momentum: a function of the number of Muon updates so far during a warm-up, a float when
  constant and not `MUON_MOMENTUM`, or None when it is optax's default `MUON_MOMENTUM` throughout (the
  optimizer is then built as before the momentum was a field, with the same state and numbers).

  With `optim.muon_momentum_warmup_steps` = W > 0 the momentum goes linearly from
  `optim.muon_momentum_start` at the first update to `optim.muon_momentum` (m) at update W and stays
  there, as the records compute it from #9 on: `frac = min(step / W, 1); (1 - frac) * start + frac * m`.
  It counts the optimizer's own updates (a momentum averages the updates it has taken), which in a
  baseline run are its steps; a step skipped as non-finite is not one."""
  final = final_muon_momentum(optim)
  steps = int(optim.get("muon_momentum_warmup_steps", 0))
  if steps == 0:
    return None if final == MUON_MOMENTUM else final
  start = float(optim.muon_momentum_start)

  def momentum(count: jax.Array) -> jax.Array:
    frac = jnp.minimum(jnp.asarray(count, jnp.float32) / steps, 1.0)
    return (1 - frac) * start + frac * final

  return momentum


def _decay_mask(params: Any) -> Any:
  """Weight decay on matrices only: not on biases, LayerNorm parameters (ndim < 2)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


ADAMW_LR_RATIOS = ("adamw_embed_lr_ratio", "adamw_head_lr_ratio")
"""The fields of `config.optim` that set the LR of the embeddings and of the head under 'adamw' and
'adam' (`adamw_group_labels`), as ratios of the learning rate; 1.0 by default."""


def adamw_lr_ratios(optim: Any) -> tuple[float, float]:
  """(`optim.adamw_embed_lr_ratio`, `optim.adamw_head_lr_ratio`); a block written before they existed
  gives 1.0, 1.0 (every parameter at the learning rate, which it trained with)."""
  return tuple(float(optim.get(name, 1.0)) for name in ADAMW_LR_RATIOS)


def adamw_group_labels(params: Any) -> Any:
  """'embed', 'head' or 'rest' for each leaf of `params`: the embed and head groups of
  `muon_group_labels` (a token embedding tied to the head is in 'embed'), and every other leaf."""
  groups = muon_group_labels(params, tied_label="embed")
  return jax.tree.map(lambda label: label if label in ("embed", "head") else "rest", groups)


def _scale_groups(embed_ratio: float, head_ratio: float) -> optax.GradientTransformation:
  """Multiplies the updates of the embed and head groups (`adamw_group_labels`) by their ratios. After
  AdamW, whose whole update (weight decay included) is proportional to its rate, that is AdamW at the
  ratio times the rate on the group; it keeps no state, so the Adam(W) state keeps its layout."""
  return optax.partition(
    {"embed": optax.scale(embed_ratio), "head": optax.scale(head_ratio), "rest": optax.identity()},
    adamw_group_labels,
  )


def make_optimizer(optim: Any) -> optax.GradientTransformation:
  """The optimizer named by `optim.name` ('adamw', 'adam', 'sgd' with momentum 0.9, 'muon'), with
  global-norm clipping at `optim.grad_clip` (0 = off).

  'muon': `optax.contrib.muon` (weight decay `optim.muon_weight_decay`) on the hidden matrices and
  AdamW (`b1`, `b2`, `eps`, `weight_decay`) at `optim.adam_lr_ratio` times the learning rate on the
  rest, split by `muon_labels`. Its momentum is `optim.muon_momentum`, warmed up with
  `optim.muon_momentum_warmup_steps` (`muon_momentum`).

  'adamw' and 'adam': the embeddings' and the head's updates (`adamw_group_labels`) are multiplied by
  `optim.adamw_embed_lr_ratio` and `adamw_head_lr_ratio` when either is not 1.0 (another optimizer
  with either set is refused: `adamw_ratio_error`).

  The learning rate is an injected hyperparameter whose value `with_learning_rate` sets before
  each update (for 'muon', in both groups); it is never a schedule of the optimizer's own update
  count.
  """
  # Floats, whatever a config holds: an int hyperparameter would be injected as an int32 array.
  b1, b2, eps, wd = float(optim.b1), float(optim.b2), float(optim.eps), float(optim.weight_decay)

  def adamw():
    return optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
      learning_rate=0.0, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=_decay_mask
    )

  ratios = adamw_lr_ratios(optim)
  if ratios != (1.0, 1.0) and optim.name not in ("adamw", "adam"):
    raise ValueError(adamw_ratio_error(optim.name, ratios))
  if optim.name == "adamw":
    core = adamw()
  elif optim.name == "muon":
    momentum = muon_momentum(optim)
    if momentum is None:
      muon = optax.inject_hyperparams(_muon)(learning_rate=0.0, weight_decay=float(optim.muon_weight_decay))
    else:
      muon = optax.inject_hyperparams(_muon_with_momentum)(
        learning_rate=0.0, weight_decay=float(optim.muon_weight_decay), beta=momentum
      )
    # One injected learning rate per group, both set to the same value: the AdamW group's update
    # is scaled afterwards, which is AdamW at `adam_lr_ratio` times the rate.
    rest = optax.chain(adamw(), optax.scale(float(optim.adam_lr_ratio)))
    core = optax.partition({"muon": muon, "adamw": rest}, muon_labels)
  elif optim.name == "muon_groups":
    core = _muon_groups(optim)
  elif optim.name == "adam":
    core = optax.inject_hyperparams(optax.adam)(learning_rate=0.0, b1=b1, b2=b2, eps=eps)
  elif optim.name == "sgd":
    core = optax.inject_hyperparams(optax.sgd)(learning_rate=0.0, momentum=0.9)
  else:
    raise ValueError(
      f"--config.optim.name={optim.name!r} is not a built-in optimizer {BUILTIN_OPTIMIZERS}: use one of them, "
      "or pass an optimizer of your own to `train(tx=...)` under this name"
    )
  if ratios != (1.0, 1.0):  # only then: at the defaults the optimizer is built as before the fields existed
    core = optax.chain(core, _scale_groups(*ratios))
  if optim.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(float(optim.grad_clip)), core)
  return core


def adamw_ratio_error(name: str, ratios: tuple[float, float]) -> str:
  """The refusal of `optim.adamw_embed_lr_ratio` / `adamw_head_lr_ratio` set away from 1.0 with an
  optimizer other than 'adamw' and 'adam' (they would be silently ignored)."""
  set_ = [f"--config.optim.{f}={r}" for f, r in zip(ADAMW_LR_RATIOS, ratios) if r != 1.0]
  return (
    f"{' and '.join(set_)} {'apply' if len(set_) > 1 else 'applies'} to --config.optim.name='adamw' or 'adam' "
    f"only, not {name!r}: set {'them' if len(set_) > 1 else 'it'} back to 1.0, or use 'adamw'/'adam' "
    "('muon_groups' has its own --config.optim.embed_lr_ratio and head_lr_ratio)"
  )


def tied_head_settings(optim: Any) -> tuple[float, float, float, float]:
  """(LR ratio, b1, b2, eps) of a token embedding tied to the head under 'muon_groups':
  `optim.tied_lr_ratio`, `tied_b1`, `tied_b2`, `tied_eps` (the records #3-#7 gave the tied matrix
  AdamW at about 0.36 of Muon's rate, betas (0.9, 0.95), eps 1e-8). A block without them (written
  before they existed) gives the head group's, which is what it trained with."""
  get = lambda name, fallback: float(optim.get(name, optim[fallback]))
  return (
    get("tied_lr_ratio", "head_lr_ratio"),
    get("tied_b1", "groups_b1"),
    get("tied_b2", "groups_b2"),
    get("tied_eps", "groups_eps"),
  )


def _muon_groups(optim: Any) -> optax.GradientTransformation:
  """The speedrun's optimizer: Muon (no weight decay) on the hidden matrices, Adam on the
  embeddings, the head and the scalars (`muon_group_labels`), each Adam group at its own fixed ratio
  of the learning rate (`optim.embed_lr_ratio`, `head_lr_ratio`, `scalar_lr_ratio`) with
  `optim.groups_b1`, `groups_b2`, `groups_eps`; a token embedding tied to the head at
  `tied_head_settings`; `optim.groups_lr_scale` multiplies all of these ratios. As for 'muon', every
  group's injected learning rate is set to the one schedule's value, and an Adam group's update is
  scaled by its ratio after. Muon's momentum is `optim.muon_momentum`, warmed up with
  `optim.muon_momentum_warmup_steps` (`muon_momentum`).

  A tied head whose settings are the untied head's shares its group ('head'): the optimizer state
  then has the layout it had before the tied head had settings of its own, and the same numbers."""
  b1, b2, eps = float(optim.groups_b1), float(optim.groups_b2), float(optim.groups_eps)
  # `optim.groups_lr_scale` multiplies every Adam group's ratio; times 1.0 (the default) a ratio is
  # exactly itself. A block written before the field existed gives 1.0.
  scale = float(optim.get("groups_lr_scale", 1.0))

  def adam(ratio, b1=b1, b2=b2, eps=eps):
    return optax.chain(
      optax.inject_hyperparams(optax.adam)(learning_rate=0.0, b1=b1, b2=b2, eps=eps),
      optax.scale(float(ratio) * scale),
    )

  momentum = muon_momentum(optim)
  if momentum is None:
    muon = optax.inject_hyperparams(_muon)(learning_rate=0.0, weight_decay=0.0)
    muon_qkv = optax.inject_hyperparams(_muon_batched)(learning_rate=0.0)
  else:
    muon = optax.inject_hyperparams(_muon_with_momentum)(learning_rate=0.0, weight_decay=0.0, beta=momentum)
    muon_qkv = optax.inject_hyperparams(_muon_batched_with_momentum)(learning_rate=0.0, beta=momentum)
  transforms = {
    "muon": muon,
    "muon_qkv": _blocks_of_three(muon_qkv),
    "embed": adam(optim.embed_lr_ratio),
    "head": adam(optim.head_lr_ratio),
    "scalar": adam(optim.scalar_lr_ratio),
  }
  tied = tied_head_settings(optim)
  tied_label = "head"
  if tied != (float(optim.head_lr_ratio), b1, b2, eps):
    tied_label = "tied_head"
    transforms["tied_head"] = adam(tied[0], b1=tied[1], b2=tied[2], eps=tied[3])
  return optax.partition(transforms, functools.partial(muon_group_labels, tied_label=tied_label))


BUILTIN_OPTIMIZERS = ("adamw", "adam", "sgd", "muon", "muon_groups")
"""The names `make_optimizer` builds from `config.optim`; any other `optim.name` names a user's optimizer."""

Optimizer = optax.GradientTransformation | Callable[..., optax.GradientTransformation]
"""A user's optimizer: an optax transformation whose learning rate is injected
(`optax.inject_hyperparams`), or a factory `learning_rate -> transformation`."""


def injected_learning_rates(tx: optax.GradientTransformation, params: Any) -> int:
  """How many `inject_hyperparams` states of `tx.init(params)` hold a `learning_rate`: the
  entries `with_learning_rate` sets (0: the schedule cannot drive `tx`). Nothing is allocated."""
  state = jax.eval_shape(tx.init, params)
  nodes = jax.tree.leaves(state, is_leaf=_is_inject_state)
  return sum(1 for n in nodes if _is_inject_state(n) and "learning_rate" in n.hyperparams)


def _factory_with_learning_rate(factory: Callable[..., optax.GradientTransformation]) -> Callable:
  """`factory` callable as `factory(learning_rate=...)`, as `inject_hyperparams` calls it: a factory
  whose one parameter has another name (`lambda lr: ...`) is wrapped."""
  try:
    params = inspect.signature(factory).parameters
  except (TypeError, ValueError):  # a builtin or C callable: call it by keyword and let it fail clearly
    return factory
  if "learning_rate" in params:
    return factory
  positional = [
    p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
  ]
  if len(positional) != 1:
    raise ValueError(
      f"train(tx=...) got a factory {getattr(factory, '__name__', factory)!r} with parameters "
      f"{list(params)}: a factory must take the learning rate, as its only required parameter or as "
      "`learning_rate` (e.g. `lambda learning_rate: optax.adamw(learning_rate)`)"
    )

  def with_learning_rate_kwarg(learning_rate):
    return factory(learning_rate)

  return with_learning_rate_kwarg


def resolve_optimizer(optim: Any, params: Any, tx: Optimizer | None = None) -> optax.GradientTransformation:
  """The optimizer of a run: `make_optimizer(optim)` when `tx` is None, else the user's `tx`.

  The config's schedule (`optim.learning_rate`, `optim.schedule`, ...) drives the learning rate of
  every run, through `with_learning_rate`. So a user's transformation must have its learning rate
  injected (`optax.inject_hyperparams`); a factory `learning_rate -> tx` is wrapped so that it is.
  The user's optimizer is part of what a run is: `optim.name` must name it, with a name that is not
  a built-in one, so that the config record, the checkpoint's config check and the benchmark's run
  cache tell two optimizers apart.

  Args:
    optim: the `config.optim` block.
    params: the params (or their `jax.ShapeDtypeStruct`s) the optimizer will be initialised on.
    tx: None, an `optax.GradientTransformation` with an injected `learning_rate`, or a factory.

  Raises:
    ValueError: naming the field and the fix, when `tx` and `optim.name` disagree, or when the
      schedule cannot drive `tx`'s learning rate.
  """
  if tx is None:
    return make_optimizer(optim)
  if optim.name in BUILTIN_OPTIMIZERS:
    raise ValueError(
      f"train(tx=...) got an optimizer of your own, but --config.optim.name={optim.name!r} names a built-in "
      "one: set config.optim.name to a name for your optimizer (e.g. 'my_adamw'). It goes into the run's "
      "config record, the checkpoint's config check and the benchmark's cache key, so that runs with "
      "different optimizers are never mistaken for each other"
    )
  if not isinstance(tx, optax.GradientTransformation):
    if not callable(tx):
      raise ValueError(
        f"train(tx=...) takes an optax.GradientTransformation or a factory learning_rate -> "
        f"GradientTransformation, got {type(tx).__name__}"
      )
    tx = optax.inject_hyperparams(_factory_with_learning_rate(tx))(learning_rate=0.0)
  if not injected_learning_rates(tx, params):
    raise ValueError(
      f"the optimizer {optim.name!r} given to train(tx=...) has no injected learning rate, so the schedule "
      f"(--config.optim.schedule={optim.schedule!r}, peak --config.optim.learning_rate={optim.learning_rate}) "
      "cannot drive it and would be silently ignored. Pass a factory instead, e.g. "
      "`tx=lambda learning_rate: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate))`, or "
      "build it with `optax.inject_hyperparams(optax.adamw)(learning_rate=0.0)`"
    )
  return tx


_INJECT_STATES = (optax.InjectStatefulHyperparamsState, optax.InjectHyperparamsState)


def _is_inject_state(node: Any) -> bool:
  return isinstance(node, _INJECT_STATES)


def with_learning_rate(opt_state: Any, lr: jax.Array) -> Any:
  """`opt_state` with the injected `learning_rate` of every `inject_hyperparams` state set to `lr`."""

  def put(node):
    if _is_inject_state(node) and "learning_rate" in node.hyperparams:
      old = node.hyperparams["learning_rate"]
      return node._replace(hyperparams={**node.hyperparams, "learning_rate": jnp.asarray(lr, old.dtype)})
    return node

  return jax.tree.map(put, opt_state, is_leaf=_is_inject_state)


def injected_learning_rate_values(tx: optax.GradientTransformation, params: Any) -> list[tuple[str, float | None]]:
  """(where, initial value) of each injected `learning_rate` of `tx.init(params)`, the value None where it
  is not a constant (a schedule's). Read from the traced `tx.init` (a constant hyperparameter is a literal
  or a constant of its jaxpr): nothing is computed or allocated."""
  closed, shape = jax.make_jaxpr(tx.init, return_shape=True)(params)
  leaves = jax.tree_util.tree_flatten_with_path(shape)[0]
  if len(leaves) != len(closed.jaxpr.outvars):
    return []
  consts = dict(zip(closed.jaxpr.constvars, closed.consts))
  found = []
  for (path, _), var in zip(leaves, closed.jaxpr.outvars):
    names = [getattr(k, "name", getattr(k, "key", None)) for k in path]
    if names[-2:] != ["hyperparams", "learning_rate"]:
      continue
    value = None
    if isinstance(var, jax.extend.core.Literal):
      value = float(var.val)
    elif var in consts and np.ndim(consts[var]) == 0:
      value = float(consts[var])
    found.append(("state" + jax.tree_util.keystr(path), value))
  return found


def overwritten_learning_rate_errors(tx: optax.GradientTransformation, params: Any, optim: Any) -> list[str]:
  """The injected learning rates of a user's `tx` (resolved: `resolve_optimizer`) that the config's
  schedule would silently write over: `with_learning_rate` sets every injected `learning_rate` to the
  schedule's value before each update, so a number written there (`inject_hyperparams(optax.adamw)(
  learning_rate=1e-4)`) is never trained at. Accepted: the schedule's peak `optim.learning_rate`, and
  0.0, which states no rate (the form a factory is wrapped in). A line per rate refused, naming both
  values and the fix."""
  peak = float(optim.learning_rate)
  errors = []
  for where, value in injected_learning_rate_values(tx, params):
    if value is None or value == 0.0 or np.isclose(value, peak, rtol=1e-6, atol=0.0):  # float32 rounding
      continue
    errors.append(
      f"the optimizer {optim.name!r} given to train(tx=...) injects learning_rate={value:g} ({where}), but the "
      f"config's schedule (--config.optim.schedule={optim.get('schedule', 'cosine')!r}, peak "
      f"--config.optim.learning_rate={optim.learning_rate}) writes its own rate over it before every update: the run "
      f"would train at the schedule's rate, never at {value:g}. To train at {value:g}, set "
      f"--config.optim.learning_rate={value:g} (and inject that value, or 0.0); or pass a factory, "
      "tx=lambda learning_rate: optax.adamw(learning_rate)"
    )
  return errors


def init_train_state(
  params: Any,
  tx: optax.GradientTransformation,
  averaging_beta: float | None = None,
  outer: OuterMomentum | None = None,
) -> TrainState:
  """A fresh state at step 0 with the optimizer initialised on `params`; with `averaging_beta`
  (0 < beta < 1) it also carries the params' moving average (`Averaging`), and with `outer` (see
  `init_outer_momentum`) outer momentum."""

  # Distinct buffers: the state is donated, and one buffer cannot be donated twice.
  def zero():
    return jnp.zeros((), jnp.int32)

  averaging = None
  if averaging_beta is not None:
    if not 0.0 < float(averaging_beta) < 1.0:
      raise ValueError(f"the averaging beta must be in (0, 1), got {averaging_beta}")
    averaging = Averaging(
      params=jax.tree.map(lambda p: jnp.array(p, copy=True), params),
      beta=jnp.asarray(float(averaging_beta), jnp.float32),
    )
  return TrainState(
    params=params,
    opt_state=tx.init(params),
    step=zero(),
    nonfinite_streak=zero(),
    nonfinite_total=zero(),
    averaging=averaging,
    outer=outer,
  )


def update_average(averaging: Averaging | None, params: Any, count: jax.Array) -> Averaging | None:
  """The average after its `count`-th step (count >= 1) took in `params`; None stays None.

  The bias-corrected weight of the new params is (1 - beta) / (1 - beta^count): 1 at the first
  step (the average is the params), tending to 1 - beta.
  """
  if averaging is None:
    return None
  beta = averaging.beta
  count = jnp.asarray(count, jnp.float32)
  weight = (1.0 - beta) / (1.0 - beta**count)
  new = jax.tree.map(lambda a, p: a + weight * (p.astype(a.dtype) - a), averaging.params, params)
  return averaging.replace(params=new)


def next_train_state(state: TrainState, params: Any, opt_state: Any, applied: jax.Array) -> TrainState:
  """The state after one real step: step + 1, the average updated, and the non-finite counters
  updated by `applied` (False when `guarded_update` skipped the update)."""
  skipped = (~applied).astype(jnp.int32)
  outer = state.outer
  if outer is not None:  # the outer step comes before the average takes the params in
    outer, params = outer_momentum_step(outer, params, state.step + 1, applied)
  return TrainState(
    params=params,
    opt_state=opt_state,
    step=state.step + 1,
    nonfinite_streak=jnp.where(applied, 0, state.nonfinite_streak + 1),
    nonfinite_total=state.nonfinite_total + skipped,
    averaging=update_average(state.averaging, params, state.step + 1),
    outer=outer,
  )


def moved_train_state(state: TrainState, params: Any) -> TrainState:
  """The state after a step that moved the params without an optimizer update (a predicted
  step): step + 1 and the average updated; the optimizer state and counters are kept."""
  return state.replace(
    params=params, step=state.step + 1, averaging=update_average(state.averaging, params, state.step + 1)
  )


def final_params(state: TrainState) -> Any:
  """The run's model: the averaged params when the state averages, else the params."""
  return state.params if state.averaging is None else state.averaging.params


def global_norm(tree: Any) -> jax.Array:
  """L2 norm over all leaves, in float32."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def tree_where(cond: jax.Array, a: Any, b: Any) -> Any:
  """Leafwise `jnp.where(cond, a, b)` for two trees of the same structure."""
  return jax.tree.map(lambda x, y: jnp.where(cond, x, y), a, b)


def all_finite(tree: Any) -> jax.Array:
  """True when every floating-point element of `tree` is finite (integer leaves always are)."""
  checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True)


def per_example_losses(loss_fn: LossFn, params: Any, batch: Batch) -> jax.Array:
  """(B,) the loss of each example of `batch` alone: `loss_fn` on one-example batches, vmapped.

  What a method that declares `READS = {'per_example_losses'}` computes (e.g. to choose which
  examples to backpropagate); any `loss_fn` of a mean loss works unchanged. Leaves whose leading
  axis is the batch's are split; the others (a dropout key) are shared."""
  sizes = {np.shape(x)[0] for x in jax.tree.leaves(batch) if np.ndim(x) >= 1}
  if len(sizes) != 1:
    raise ValueError(f"per_example_losses: the batch's leaves have leading axes {sorted(sizes)}, not one batch size")
  (n,) = sizes
  axes = jax.tree.map(lambda x: 0 if np.ndim(x) >= 1 and np.shape(x)[0] == n else None, batch)

  def one(example):
    single = jax.tree.map(lambda x, a: x[None] if a == 0 else x, example, axes)
    return loss_fn(params, single)[0].astype(jnp.float32)

  return jax.vmap(one, in_axes=(axes,))(batch)


def loss_and_grads(loss_fn: LossFn, params: Any, batch: Batch, grad_accum: int = 1) -> tuple[jax.Array, Any]:
  """Mean loss and gradient over `batch`, accumulated over `grad_accum` micro-batches.

  Accumulation is a `lax.scan` over micro-batches, so one optimizer step is one `step` whatever
  `grad_accum` is, and the peak activation memory is that of one micro-batch.
  """
  grad_fn = jax.value_and_grad(lambda p, b: loss_fn(p, b)[0])
  if grad_accum == 1:
    # The barrier fixes the fusion boundary: every program that calls this computes the same bits.
    return jax.lax.optimization_barrier(grad_fn(params, batch))

  def split(x):
    return x.reshape((grad_accum, x.shape[0] // grad_accum) + x.shape[1:])

  def body(carry, mb):
    loss_sum, grad_sum = carry
    loss, grads = grad_fn(params, mb)
    return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  micro = jax.tree.map(split, batch)
  (loss_sum, grad_sum), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro)
  scale = 1.0 / grad_accum
  return jax.lax.optimization_barrier((loss_sum * scale, jax.tree.map(lambda g: g * scale, grad_sum)))


def guarded_update(
  tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any, lr: jax.Array, finite: jax.Array
) -> tuple[Any, Any, Any]:
  """One optimizer update at learning rate `lr`, skipped (params and optimizer state kept) when
  not `finite`. Returns (params, opt_state, updates).

  The baseline and hybrid real steps share this function, so with prediction off they compute
  bit-identical params. The optimization barriers fix XLA's fusion boundaries around the update
  (a hybrid real step also reads the gradient and the update for its statistics, which would
  otherwise fuse differently and round differently); for the same reason no other check reads the
  new state here. `finite` covers the loss and the gradient's global norm: a finite global norm
  means every squared gradient is finite, so Adam's moments and update stay finite too.
  """
  # The barrier on `lr` keeps its arithmetic out of the update's fusions (XLA may contract a
  # multiply-add differently in another program), so every program uses the same learning rate.
  lr = jax.lax.optimization_barrier(lr)
  updates, new_opt = tx.update(grads, with_learning_rate(opt_state, lr), params)
  updates, new_opt = jax.lax.optimization_barrier((updates, new_opt))
  new_params = optax.apply_updates(params, updates)
  return tree_where(finite, new_params, params), tree_where(finite, new_opt, opt_state), updates


def train_step(
  state: TrainState,
  batch: Batch,
  schedule: Schedule,
  *,
  loss_fn: LossFn,
  tx: optax.GradientTransformation,
  grad_accum: int = 1,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One baseline optimizer step. Pure; jit it with the state donated (`donate_argnums=0`).

  A non-finite loss or gradient skips the update (like `optax.apply_if_finite`), so one bad batch
  cannot poison the params; hybrid training does the same.
  """
  loss, grads = loss_and_grads(loss_fn, state.params, batch, grad_accum)
  grad_norm = global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  lr = learning_rate(schedule, state.step)
  params, opt_state, _ = guarded_update(tx, grads, state.opt_state, state.params, lr, finite)
  metrics = {"loss": loss, "grad_norm": grad_norm}
  return next_train_state(state, params, opt_state, finite), metrics
