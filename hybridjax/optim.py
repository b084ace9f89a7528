"""The optimizer layer: what a plain optax loop carries and does, as pure functions.

It imports only the built-in optimizers (`hybridjax.optimizers`, re-exported here) and the field
declarations (`hybridjax.schema`); the hybrid algorithm (`hybridjax.hybrid`) and the host loop
(`hybridjax.loop`) are built on it.

* `FIELDS`: every `config.optim` field, declared once: the schedule's and outer momentum's here,
  beside what reads them (every run reads them), and each built-in optimizer's in `optimizers`.

* `TrainState` and its init/next functions.
* `Schedule`: the learning-rate schedule (cosine or WSD) as runtime arrays (peak LR, warm-up,
  length, floor, start of the decay); only its kind is static. The
  learning rate is `learning_rate(schedule, step)` of the *global* step and is injected into the
  optimizer state before each update (optax's public `inject_hyperparams` state), so hybrid
  training, whose predicted steps consume schedule time without an optimizer update, keeps the
  baseline's schedule; and since nothing about the schedule is a compile-time constant, one
  compiled step serves every learning rate and budget of a sweep.
* `make_optimizer` (the built-ins of `optimizers.OPTIMIZERS`: the AdamW family, SGD, Muon on the hidden matrices),
  `loss_and_grads`, `guarded_update` (skips a non-finite update), `global_norm`, `tree_where`,
  `all_finite`, and the baseline `train_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from hybridjax import schema
from hybridjax.optimizers import (  # noqa: F401  (the optimizers' public names, as `hybridjax.optim.<name>`)
  ADAMW_LR_RATIOS,
  BUILTIN_OPTIMIZERS,
  OPTIMIZERS,
  Optimizer,
  adamw_group_labels,
  eval_params,
  injected_learning_rates,
  make_optimizer,
  muon_group_labels,
  muon_labels,
  muon_momentum,
  relation_errors,
  resolve_optimizer,
  tied_head_settings,
  with_learning_rate,
)
from hybridjax.optimizers import FIELDS as OPTIMIZER_FIELDS

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


def _not_wsd(config: Any) -> str | None:
  schedule = config.optim.get("schedule", "cosine")
  if schedule == "wsd":
    return None
  return (
    f"it is the share of the 'wsd' schedule spent decaying, and --config.optim.schedule={schedule!r} decays from "
    "the end of the warm-up (optim.make_schedule). Set --config.optim.schedule=wsd to train with it"
  )


def _outer_off(config: Any) -> str | None:
  if int(config.optim.get("outer_every", 0)):
    return None
  return (
    "--config.optim.outer_every=0 turns outer momentum off (loop.drivers.outer_settings). Set "
    "--config.optim.outer_every above 0 (the real steps between outer steps) to train with it"
  )


F = schema.Field
SCHEDULE = F(
  "schedule",
  "cosine",
  schema.check_choice("cosine", "wsd"),
  "'cosine': warm-up, then cosine decay; 'wsd': warm-up, stable at the peak, then linear decay over the last "
  "decay_fraction",
  other="wsd",
)
# What every run reads, whatever its optimizer (a user's `train(tx=...)` too): the optimizer's name
# (the run's record), the schedule (`make_schedule`, which drives every optimizer's injected
# learning rate) and outer momentum (`OuterMomentum`, through `loop.drivers.outer_settings`).
RUN_FIELDS: tuple[schema.Field, ...] = (
  F(
    "name",
    "adamw",
    schema.check_name,
    "a built-in optimizer (`optimizers.OPTIMIZERS`), or the name of one passed to `train(tx=...)`",
  ),
  F(
    "learning_rate",
    3e-3,
    schema.check_num(0.0, lo_open=True),
    "the schedule's peak LR (for Muon: of its matrices)",
    other=1e-2,
  ),
  SCHEDULE,
  F("warmup_steps", 50, schema.check_int(0), "linear warm-up steps, below trainer.steps; 0 = none", other=10),
  F("decay_steps", 0, schema.check_int(0), "the schedule's length; 0 = the run's (trainer.steps)", other=60),
  F(
    "decay_fraction",
    0.2,
    schema.check_num(0.0, 1.0, lo_open=True),
    "'wsd': the share of the schedule spent decaying",
    other=0.5,
    unread=_not_wsd,
  ),
  F("min_lr_ratio", 0.1, schema.check_num(0.0, 1.0), "the floor: final lr = learning_rate * min_lr_ratio", other=0.5),
  F(
    "outer_every",
    0,
    schema.check_int(0),
    "outer Nesterov momentum on K-step displacements every K real steps "
    "(d = params - slow; m = mu m + d; slow += eta (mu m + d); params = slow); 0 = off",
    other=4,
  ),
  F(
    "outer_eta",
    0.8,
    schema.check_num(0.0, 2.0, lo_open=True),
    "outer momentum's learning rate",
    other=0.5,
    unread=_outer_off,
  ),
  F(
    "outer_mu",
    0.75,
    schema.check_num(0.0, 1.0, hi_open=True),
    "outer momentum's momentum",
    other=0.5,
    unread=_outer_off,
  ),
)

FIELDS: tuple[schema.Field, ...] = (*RUN_FIELDS, *OPTIMIZER_FIELDS)
"""Every field of `config.optim`, declared once (`default_optim_config` is built from them)."""


def default_optim_config() -> Any:
  """The `optim` block at its defaults: AdamW with linear warm-up and cosine decay, and global-norm clipping."""
  return schema.block(FIELDS)


def make_schedule(optim: Any, total_steps: int) -> Schedule:
  """The `Schedule` of an optim config block (`schedule`, `learning_rate`, `warmup_steps`,
  `decay_steps` (0 = `total_steps`), `min_lr_ratio`, `decay_fraction`) for a run of `total_steps`.

  'wsd' decays over the last `round(decay_fraction * decay_steps)` steps (at least one, so the
  floor is reached at `decay_steps`), never into the warm-up.
  """
  kind = optim.get("schedule", "cosine")
  schema.raise_invalid(schema.errors("optim", [SCHEDULE], {"schedule": kind}))
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
  peak, warmup, alpha = schedule.peak_lr, schedule.warmup_steps, schedule.min_lr_ratio
  # Warm-up: optax.linear_schedule(0, peak, warmup).
  count = jnp.clip(step, 0, warmup)
  warm = (0.0 - peak) * (1 - count / jnp.maximum(warmup, 1)) + peak
  warm = jnp.where(warmup > 0, warm, peak)  # no warm-up: a constant schedule at the peak
  if schedule.kind == "wsd":
    # WSD past the warm-up: the peak until `decay_start`, then linear to `peak * min_lr_ratio` at
    # `decay_steps`, and the floor after it.
    start = warmup if schedule.decay_start is None else schedule.decay_start
    length = jnp.maximum(schedule.decay_steps - start, 1).astype(jnp.float32)
    frac = jnp.clip((step - start).astype(jnp.float32) / length, 0.0, 1.0)  # 0 -> 1 over the decay
    linear = peak * ((1 - alpha) * (1 - frac) + alpha)  # exactly the floor at frac = 1
    return jnp.where(step < warmup, warm, jnp.where(step < start, peak, linear))
  # Decay: optax.cosine_decay_schedule(peak, decay_steps - warmup, alpha=min_lr_ratio).
  decay_steps = (schedule.decay_steps - warmup).astype(jnp.float32)
  count = jnp.minimum((step - warmup).astype(jnp.float32), decay_steps)
  cosine_decay = 0.5 * (1 + jnp.cos(jnp.pi * count / decay_steps))
  cosine = peak * ((1 - alpha) * cosine_decay + alpha)
  return jnp.where(step < warmup, warm, cosine)


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
  # An optimizer state that holds an array twice, or one of the params' (schedule-free's: its average
  # starts at the params, its b1 is also a hyperparameter), gets a copy of each second one.
  held = {id(p) for p in jax.tree.leaves(params)}

  def own(x):
    if id(x) in held:
      return jnp.array(x, copy=True)
    held.add(id(x))
    return x

  return TrainState(
    params=params,
    opt_state=jax.tree.map(own, tx.init(params)),
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
    averaging=update_average(state.averaging, eval_params(opt_state, params), state.step + 1),
    outer=outer,
  )


def moved_train_state(state: TrainState, params: Any) -> TrainState:
  """The state after a step that moved the params without an optimizer update (a predicted
  step): step + 1 and the average updated; the optimizer state and counters are kept."""
  return state.replace(
    params=params, step=state.step + 1, averaging=update_average(state.averaging, params, state.step + 1)
  )


def raw_params(state: TrainState) -> Any:
  """The params a state is evaluated at unaveraged: the params, or the point its optimizer evaluates
  at instead (`optimizers.eval_params`: schedule-free's average)."""
  return eval_params(state.opt_state, state.params)


def final_params(state: TrainState) -> Any:
  """The run's model: the averaged params when the state averages, else `raw_params`."""
  return raw_params(state) if state.averaging is None else state.averaging.params


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
  axes = jax.tree.map(lambda x: 0 if np.ndim(x) >= 1 else None, batch)

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
  params, opt_state, _ = guarded_update(
    tx, grads, state.opt_state, state.params, learning_rate(schedule, state.step), finite
  )
  return next_train_state(state, params, opt_state, finite), {"loss": loss, "grad_norm": grad_norm}
