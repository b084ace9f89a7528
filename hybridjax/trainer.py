"""The training loop: the plain optax baseline, and the host loop that hybrid training shares.

The baseline is what hybrid training is measured against, so it is a good optax loop, not a straw man:
one jitted, donating update step returning (state, metrics), AdamW with warm-up and cosine decay,
global-norm clipping and gradient accumulation.
"""

from __future__ import annotations

import gc
import json
import os
import time
from typing import Any, Callable, Iterable, Mapping

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from hybridjax import checkpoint as ckpt_lib
from hybridjax import memory as memory_lib
from hybridjax import sharding as sharding_lib
from hybridjax import writers

LossFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, Any]]
Batch = Mapping[str, Any]


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


class TrainingDiverged(RuntimeError):
  """Raised by `train` when updates stay non-finite (`trainer.max_nonfinite_steps` in a row, or
  `hybrid.health.max_events` non-finite events); no checkpoint of the diverged state is written."""


# --- optimizer ---------------------------------------------------------------------------------

def make_schedule(optim: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warm-up to `learning_rate`, then cosine decay to `learning_rate * min_lr_ratio`."""
  decay_steps = optim.decay_steps or total_steps
  warmup = min(optim.warmup_steps, max(decay_steps - 1, 0))
  lr = float(optim.learning_rate)  # an int from a config would become an int32 inside JAX
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup > 0 else lr,
      peak_value=lr,
      warmup_steps=warmup,
      decay_steps=max(decay_steps, warmup + 1),
      end_value=lr * float(optim.min_lr_ratio))


def _decay_mask(params: Any) -> Any:
  """Weight decay on matrices only: not on biases, LayerNorm parameters (ndim < 2)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(optim: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  """The optimizer named by `optim.name`, with clipping and the schedule of `make_schedule`.

  The learning rate is an injected hyperparameter, so its schedule can be made to follow the global
  step (see `sync_schedule`): hybrid training takes steps that never reach the optimizer.
  """
  schedule = make_schedule(optim, total_steps)
  # Floats, whatever a config holds: an int hyperparameter would be injected as an int32 array.
  b1, b2, eps, wd = (float(optim.b1), float(optim.b2), float(optim.eps),
                     float(optim.weight_decay))
  if optim.name == "adamw":
    core = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
        learning_rate=schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=_decay_mask)
  elif optim.name == "adam":
    core = optax.inject_hyperparams(optax.adam)(learning_rate=schedule, b1=b1, b2=b2, eps=eps)
  elif optim.name == "sgd":
    core = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule, momentum=0.9)
  else:
    raise ValueError(f"--config.optim.name must be 'adamw', 'adam' or 'sgd', got {optim.name!r}")
  if optim.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(float(optim.grad_clip)), core)
  return core


_INJECT_STATES = tuple(t for t in (getattr(optax, "InjectStatefulHyperparamsState", None),
                                   getattr(optax, "InjectHyperparamsState", None)) if t is not None)
try:  # newer optax keeps each schedule's own counter in a WrappedScheduleState
  from optax.schedules._inject import WrappedScheduleState as _WrappedScheduleState
  _COUNTED = _INJECT_STATES + (_WrappedScheduleState,)
except ImportError:  # pragma: no cover - older optax
  _COUNTED = _INJECT_STATES


def _is_inject_state(node: Any) -> bool:
  return isinstance(node, _INJECT_STATES)


def sync_schedule(opt_state: Any, step: jax.Array) -> Any:
  """Sets the schedule counter of every `inject_hyperparams` state to the global `step`.

  A plain loop makes one optimizer update per step, so this is the identity there. Under hybrid
  training, predicted steps consume batches and schedule time without an optimizer update; this
  keeps the learning-rate schedule on the global step, as DESIGN.md requires. Optimizers built
  without `inject_hyperparams` are left untouched (their schedule then counts real updates).
  """
  def fix(node):
    if isinstance(node, _COUNTED):
      node = node._replace(count=jnp.asarray(step, jnp.asarray(node.count).dtype))
      if _is_inject_state(node):  # and the schedule states inside it
        node = node._replace(hyperparams_states=jax.tree.map(
            fix, node.hyperparams_states, is_leaf=lambda n: isinstance(n, _COUNTED)))
    return node
  return jax.tree.map(fix, opt_state, is_leaf=lambda n: isinstance(n, _COUNTED))


def current_learning_rate(opt_state: Any) -> jax.Array:
  """The learning rate last used by an `inject_hyperparams` optimizer (0 if there is none)."""
  found = [n.hyperparams["learning_rate"] for n in jax.tree.leaves(opt_state, is_leaf=_is_inject_state)
           if _is_inject_state(n) and "learning_rate" in n.hyperparams]
  return jnp.asarray(found[0], jnp.float32) if found else jnp.zeros((), jnp.float32)


def init_train_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
  """A fresh state at step 0 with the optimizer initialised on `params`."""
  # Three distinct buffers: the state is donated, and one buffer cannot be donated twice.
  zero = lambda: jnp.zeros((), jnp.int32)  # noqa: E731
  return TrainState(params=params, opt_state=tx.init(params), step=zero(),
                    nonfinite_streak=zero(), nonfinite_total=zero())


def next_train_state(state: TrainState, params: Any, opt_state: Any,
                     applied: jax.Array) -> TrainState:
  """The state after one real step: step + 1, and the non-finite counters updated by `applied`
  (False when `guarded_update` skipped the update)."""
  skipped = (~applied).astype(jnp.int32)
  return TrainState(params=params, opt_state=opt_state, step=state.step + 1,
                    nonfinite_streak=jnp.where(applied, 0, state.nonfinite_streak + 1),
                    nonfinite_total=state.nonfinite_total + skipped)


def global_norm(tree: Any) -> jax.Array:
  """L2 norm over all leaves, in float32."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


# --- steps -------------------------------------------------------------------------------------

def loss_and_grads(loss_fn: LossFn, params: Any, batch: Batch,
                   grad_accum: int = 1) -> tuple[jax.Array, jax.Array]:
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

  micro = jax.tree.map(split, batch)

  def body(carry, mb):
    loss_sum, grad_sum = carry
    loss, grads = grad_fn(params, mb)
    return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  (loss_sum, grad_sum), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro)
  scale = 1.0 / grad_accum
  return jax.lax.optimization_barrier((loss_sum * scale, jax.tree.map(lambda g: g * scale, grad_sum)))


def optimizer_update(tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any,
                     step: jax.Array) -> tuple[Any, Any]:
  """`tx.update` with the schedule on the global step, between optimization barriers.

  The barriers fix XLA's fusion boundaries around the update, so the baseline and a hybrid real
  step (whose program also reads the gradient and the update for its statistics) compute
  bit-identical updates. They cost one materialisation of the gradient, which XLA makes anyway.
  """
  updates, opt_state = tx.update(grads, sync_schedule(opt_state, step), params)
  return jax.lax.optimization_barrier((updates, opt_state))


def tree_where(cond: jax.Array, a: Any, b: Any) -> Any:
  """Leafwise `jnp.where(cond, a, b)` for two trees of the same structure."""
  return jax.tree.map(lambda x, y: jnp.where(cond, x, y), a, b)


def all_finite(tree: Any) -> jax.Array:
  """True when every floating-point element of `tree` is finite (integer leaves always are)."""
  checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True)


def guarded_update(tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any,
                   step: jax.Array, finite: jax.Array) -> tuple[Any, Any, Any]:
  """One optimizer update that is skipped (params and optimizer state kept) when not `finite`.

  Returns (params, opt_state, updates). The baseline and hybrid real steps share this function,
  so with prediction off they compute bit-identical params (XLA fuses the selects into the update
  arithmetic, so a program without them would round differently; for the same reason no other
  check reads the new state here: any extra reduction over it changes the rounding of one of the
  two programs). `finite` covers the loss and the gradient's global norm; a finite global norm
  means every squared gradient is finite, so Adam's moments and update stay finite too.
  """
  updates, new_opt = optimizer_update(tx, grads, opt_state, params, step)
  new_params = optax.apply_updates(params, updates)
  return (tree_where(finite, new_params, params), tree_where(finite, new_opt, opt_state), updates)


def train_step(state: TrainState, batch: Batch, *, loss_fn: LossFn,
               tx: optax.GradientTransformation, grad_accum: int = 1) -> tuple[TrainState, dict]:
  """One optimizer step. Pure; `make_train_step` jits it with the state donated.

  A non-finite loss or gradient skips the update (like `optax.apply_if_finite`), so one bad batch
  cannot poison the params; hybrid training does the same.
  """
  loss, grads = loss_and_grads(loss_fn, state.params, batch, grad_accum)
  grad_norm = global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  params, opt_state, _ = guarded_update(tx, grads, state.opt_state, state.params, state.step, finite)
  metrics = {"loss": loss, "grad_norm": grad_norm}
  return next_train_state(state, params, opt_state, finite), metrics


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, grad_accum: int = 1, *,
                    mesh: jax.sharding.Mesh | None = None, state_shardings: Any = None
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """`train_step` jitted with `donate_argnums=0`: the old state's buffers are reused in place.

  On a multi-device `mesh` the state keeps `state_shardings` (`sharding.train_state_shardings`)
  in and out and the batch is split on dim 0; on one device (or without a mesh) it is a plain jit.
  """
  def step(state, batch):
    return train_step(state, batch, loss_fn=loss_fn, tx=tx, grad_accum=grad_accum)
  # keep_unused: inputs the step overwrites (the schedule counters) must still be donated.
  return jax.jit(step, donate_argnums=0, keep_unused=True,
                 **sharding_lib.step_jit_kwargs(state_shardings, mesh))


def make_eval_fn(loss_fn: LossFn, mesh: jax.sharding.Mesh | None = None
                 ) -> Callable[[Any, Batch], jax.Array]:
  """The jitted loss. On a multi-device `mesh` it takes the sharded params and batch as they are
  and returns the loss replicated, so every host can read it."""
  if sharding_lib.is_multi_device(mesh):
    return jax.jit(lambda params, batch: loss_fn(params, batch)[0],
                   out_shardings=sharding_lib.replicated(mesh))
  return jax.jit(lambda params, batch: loss_fn(params, batch)[0])


def evaluate(eval_fn: Callable[[Any, Batch], jax.Array], params: Any,
             batches: Iterable[Batch]) -> float:
  """Mean loss over fixed eval batches (every run sees the same ones)."""
  losses = [eval_fn(params, b) for b in batches]
  return float(np.mean(jax.device_get(losses)))


# --- the host loop -----------------------------------------------------------------------------

def enable_compile_cache(trainer_cfg: ml_collections.ConfigDict) -> str | None:
  """Turns on JAX's persistent compilation cache (cuts CPU compile time severalfold on reruns)."""
  if not trainer_cfg.compile_cache:
    return None
  path = trainer_cfg.compile_cache_dir or os.path.join(
      os.path.expanduser("~"), ".cache", "hybridjax", "jax_cache")
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


def _progress_bar(enabled: bool, total: int, initial: int):
  if not enabled:
    return None
  from tqdm.auto import tqdm
  return tqdm(total=total, initial=initial, dynamic_ncols=True, unit="step")


def _fmt(v: Any) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def format_table(rows: list[tuple[str, Any]], title: str = "") -> str:
  """A two-column text table."""
  width = max(len(k) for k, _ in rows)
  lines = [title, "-" * (width + 24)] if title else []
  lines += [f"{k:<{width}}  {_fmt(v)}" for k, v in rows]
  return "\n".join(lines)


def train(config: ml_collections.ConfigDict, workdir: str, *, init_params: Callable[[jax.Array], Any],
          loss_fn: LossFn, train_batch: Callable[[int], Batch], eval_batches: list[Batch],
          tokens_per_step: int | None = None, extra_meta: dict | None = None,
          hooks: Mapping[str, Callable] | None = None) -> dict[str, Any]:
  """Trains `config.mode` ('baseline' or 'hybrid') for `config.trainer.steps` steps.

  Args:
    config: a validated experiment config (see `hybridjax.config`).
    workdir: checkpoints, metrics.jsonl, TensorBoard files and summary.json go here. If it holds a
      checkpoint, training resumes from it (see `config.resume`).
    init_params: rng -> params.
    loss_fn: (params, batch) -> (loss, aux).
    train_batch: step -> batch; must be deterministic in the step so a resumed run sees the same data.
    eval_batches: fixed held-out batches.
    tokens_per_step: for the tokens/s figure.
    extra_meta: JSON-able facts stored with every checkpoint (e.g. the data source).
    hooks: optional callbacks; `on_log(step, record)` is called at every log.

  Returns:
    The run summary (also written to `<workdir>/summary.json`).
  """
  hooks = dict(hooks or {})
  tcfg = config.trainer
  os.makedirs(workdir, exist_ok=True)
  enable_compile_cache(tcfg)
  # Multi-host start-up (a no-op unless config.distributed.enabled), then the device mesh.
  sharding_lib.initialize_distributed(config)
  mesh = sharding_lib.make_mesh(config)
  multi = sharding_lib.is_multi_device(mesh)  # one device: exactly the single-device programs
  total_steps = tcfg.steps
  tx = make_optimizer(config.optim, total_steps)
  rng = jax.random.PRNGKey(config.seed)
  params_rng, hybrid_rng = jax.random.split(rng)

  if config.mode == "baseline":
    def init_state():
      return init_train_state(init_params(params_rng), tx)
    state_shardings = None
    if multi:
      state_shardings = sharding_lib.train_state_shardings(jax.eval_shape(init_state), mesh)
      init_state = sharding_lib.sharded_init(init_state, state_shardings)
    step_fn = make_train_step(loss_fn, tx, tcfg.grad_accum, mesh=mesh,
                              state_shardings=state_shardings)
    params_of = lambda s: s.params  # noqa: E731
    driver = None
  elif config.mode == "hybrid":
    from hybridjax import steps as hybrid_steps  # the hybrid core
    driver = hybrid_steps.HybridDriver(config, loss_fn=loss_fn, tx=tx, rng=hybrid_rng,
                                       init_params=lambda: init_params(params_rng), mesh=mesh)
    init_state = driver.init_state
    state_shardings = driver.state_shardings
    step_fn = driver.step
    params_of = lambda s: s.train.params  # noqa: E731
  else:
    raise ValueError(f"--config.mode must be 'baseline' or 'hybrid', got {config.mode!r}")

  train_of = lambda s: getattr(s, "train", s)  # noqa: E731  (the TrainState inside a HybridState)

  # Resume or start.
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"),
                                  max_to_keep=tcfg.max_to_keep)
  config_json = json.loads(config.to_json())
  start_step = 0
  latest = manager.latest_step()
  if latest is not None:
    if config.resume == "never":
      raise ValueError(f"--workdir {workdir} already holds a run (checkpoint at step {latest}); "
                       "use a new --workdir, or --config.resume=auto to resume it.")
    meta = ckpt_lib.read_meta(manager, latest)
    diffs = ckpt_lib.config_differences(meta.get("config", {}), config)
    if diffs and config.resume != "force":
      raise ValueError(
          f"--workdir {workdir} holds a run with a different config:\n  " + "\n  ".join(diffs) +
          "\nUse a new --workdir, or pass --config.resume=force to resume it anyway.")
    # Restored onto this run's shardings, whatever mesh shape the checkpoint was saved from.
    abstract = sharding_lib.restore_target(jax.eval_shape(init_state), state_shardings)
    state, meta = ckpt_lib.restore(manager, latest, abstract)
    start_step = int(meta["step"])
    # The data position is meta["step"]; the state's own counter must agree with it.
    if int(jax.device_get(train_of(state).step)) != start_step:
      raise ValueError(
          f"checkpoint {manager.directory}/{latest} is inconsistent: its metadata says step "
          f"{start_step}, its state step {int(jax.device_get(train_of(state).step))}; nothing was "
          "changed. Use a fresh --workdir.")
    summary_path = os.path.join(workdir, "summary.json")
    if start_step >= total_steps and os.path.exists(summary_path):
      # A finished run: report it, and do not overwrite its summary with an empty one.
      manager.close()
      print(f"{workdir} already finished its {total_steps} steps; nothing to do "
            "(raise --config.trainer.steps to train further, or use a new --workdir)")
      with open(summary_path) as f:
        return json.load(f)
    print(f"resumed from {workdir} at step {start_step}")
  else:
    state = init_state()
    if not multi:
      # Committed to the device, as a restored state is: a fresh and a resumed run then lower to the
      # same programs (and a resumed run hits the persistent compilation cache).
      state = jax.device_put(state, jax.devices()[0])

  def save(step, state):
    meta = {"step": step, "config": config_json, "mode": config.mode}
    meta.update(extra_meta or {})
    ckpt_lib.save(manager, step, state, meta)

  max_events = config.hybrid.health.max_events if driver is not None else None

  params_finite = jax.jit(all_finite)  # a separate program: the step's own rounding is untouched

  def read_health(state) -> tuple[int, int | None, bool]:
    """(non-finite streak, non-finite health events or None, params all finite): one small read."""
    streak = train_of(state).nonfinite_streak
    events = state.controller.events[0] if driver is not None else None
    streak, events, ok = jax.device_get((streak, events, params_finite(params_of(state))))
    return int(streak), (None if events is None else int(events)), bool(ok)

  def check_health(done: int, streak: int, events: int | None, params_ok: bool = True) -> None:
    """Raises TrainingDiverged when the non-finite limits are reached; nothing more is saved."""
    if not params_ok:  # only an absurd learning rate gets here: every skipped update is checked
      reason = f"the params became non-finite by step {done}"
    elif streak >= tcfg.max_nonfinite_steps:
      reason = (f"the last {streak} steps (up to step {done}) had a non-finite loss or gradient "
                f"and their updates were skipped (limit --config.trainer.max_nonfinite_steps="
                f"{tcfg.max_nonfinite_steps})")
    elif events is not None and events >= max_events:
      reason = (f"{events} non-finite events by step {done} (limit "
                f"--config.hybrid.health.max_events={max_events})")
    else:
      return
    manager.wait_until_finished()  # earlier saves complete: they hold finite, good states
    last = manager.latest_step()
    if last is not None:
      kept = (f"the last good checkpoint, step {last}, is kept in {manager.directory} (to continue "
              "from it with a changed config, add --config.resume=force)")
    else:
      kept = "no checkpoint had been written yet"
    raise TrainingDiverged(
        f"training diverged: {reason}. No checkpoint of the diverged state was written; {kept}. "
        f"Lower --config.optim.learning_rate (now {config.optim.learning_rate}) or check the data.")

  # Multi-host: checkpoints are shared (orbax writes each process's shards); logs are not, so every
  # process but the first writes its own under process_<i>/.
  log_dir = workdir if jax.process_index() == 0 else os.path.join(
      workdir, f"process_{jax.process_index()}")
  writer = writers.MetricWriter(log_dir)
  eval_fn = make_eval_fn(loss_fn, mesh)
  eval_batches = [sharding_lib.shard_batch(b, mesh) for b in eval_batches]  # as-is on one device
  mem = memory_lib.MemoryTracker()
  mem.record()
  bar = _progress_bar(tcfg.progress, total_steps, start_step)

  first_loss = None
  last_eval = None
  compile_s = 0.0
  train_s = 0.0
  timed_steps = 0
  memory_warned = False
  t_log = time.perf_counter()
  steps_since_log = 0
  step = start_step
  try:
    for step in range(start_step, total_steps):
      batch = sharding_lib.shard_batch(train_batch(step), mesh)  # as-is on one device
      t0 = time.perf_counter()
      state, metrics = step_fn(state, batch)
      if step == start_step:
        # The first call compiles; block so its time is not charged to training.
        jax.block_until_ready(state)
        compile_s = time.perf_counter() - t0
        if driver is not None:
          driver.flush_trace()  # host records hold no device buffers: memory readings stay exact
        t_log = time.perf_counter()
        mem.mark_after_warmup()
      else:
        steps_since_log += 1
      done = step + 1
      if first_loss is None:
        first_loss = float(metrics["loss"])

      is_last = done == total_steps
      if done % tcfg.log_every == 0 or is_last:
        # The only per-log device->host transfer: the metrics and the non-finite streak.
        host, streak = jax.device_get((metrics, train_of(state).nonfinite_streak))
        if driver is not None:
          driver.flush_trace()
        jax.block_until_ready(state)
        now = time.perf_counter()
        dt = max(now - t_log, 1e-9)
        train_s += now - t_log
        timed_steps += steps_since_log
        snap = mem.record()
        record = {k: (float(v) if np.ndim(v) == 0 else np.asarray(v, np.float64).round(6).tolist())
                  for k, v in host.items() if k != "step"}
        record["steps_per_s"] = steps_since_log / dt
        record["train_s"] = train_s  # cumulative training seconds (no compile, eval or checkpoint)
        if tokens_per_step:
          record["tokens_per_s"] = steps_since_log * tokens_per_step / dt
        record["bytes_in_use"] = snap["bytes_in_use"]
        record["rss_bytes"] = snap["rss_bytes"]
        record["nonfinite_streak"] = int(streak)
        if driver is not None:
          record.update(driver.log_fields(state))
        writer.write(done, record)
        if driver is not None:
          for rec in driver.pop_trace():
            writer.write(rec.pop("step"), rec, kind="step")
          for event in driver.pop_memory_events():
            mem.observe(event)
            writer.write(event.pop("step"), event, kind="memory")
        if "on_log" in hooks:
          hooks["on_log"](done, record)
        check_health(done, int(streak), record.get("nonfinite_events"))
        if bar is not None:
          post = {"loss": f"{record['loss']:.3f}"}
          if driver is not None:
            post.update(driver.progress_fields(record))
          if tokens_per_step:
            post["tok/s"] = f"{record['tokens_per_s']:.0f}"
          post["mem"] = memory_lib.format_bytes(snap["bytes_in_use"])
          bar.set_postfix(post, refresh=False)
        t_log = time.perf_counter()
        if tcfg.memory_limit_bytes and snap["bytes_in_use"] > tcfg.memory_limit_bytes and not memory_warned:
          memory_warned = True
          print(f"WARNING: memory in use {snap['bytes_in_use']} B exceeds "
                f"trainer.memory_limit_bytes={tcfg.memory_limit_bytes}; saving an emergency checkpoint")
          save(done, state)
        steps_since_log = 0
      t_aside = time.perf_counter()
      if (tcfg.eval_every and done % tcfg.eval_every == 0) or is_last:
        last_eval = evaluate(eval_fn, params_of(state), eval_batches)
        writer.write(done, {"eval_loss": last_eval}, kind="eval")
        if bar is not None:
          bar.write(f"step {done}: eval loss {last_eval:.4f}")
      if (tcfg.checkpoint_every and done % tcfg.checkpoint_every == 0) or is_last:
        streak, events, params_ok = read_health(state)
        check_health(done, streak, events, params_ok)
        if streak:  # the last real step was skipped as non-finite: keep the previous checkpoint
          print(f"step {done}: checkpoint skipped, the last {streak} step(s) were non-finite")
        else:
          save(done, state)
      if driver is not None and time.perf_counter() - t_aside > 1e-3:
        driver.pause_timing()
      t_log += time.perf_counter() - t_aside  # eval and checkpoint time is not training time
      if bar is not None:
        bar.update(1)
    manager.wait_until_finished()
  finally:
    if bar is not None:
      bar.close()
    writer.close()
    manager.close()

  gc.collect()  # orbax's save leaves reference cycles holding device copies until collected
  mem.record()
  summary: dict[str, Any] = {
      "mode": config.mode,
      "steps": total_steps,
      "start_step": start_step,
      "first_train_loss": first_loss,
      "final_eval_loss": last_eval,
      "compile_s": compile_s,
      "train_s": train_s,
      "s_per_step": train_s / max(timed_steps, 1),
      "memory": mem.summary(),
      "mesh": sharding_lib.describe(mesh),
      # Real steps whose update was skipped as non-finite (never applied to the params).
      "nonfinite_skipped": int(jax.device_get(train_of(state).nonfinite_total)),
  }
  if tokens_per_step and train_s > 0:
    summary["tokens_per_s"] = timed_steps * tokens_per_step / train_s
  if driver is not None:
    summary.update(driver.summary(state))
  with open(os.path.join(log_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2, default=str)
  print(format_summary(summary))
  return summary


def format_summary(summary: Mapping[str, Any]) -> str:
  rows = [("mode", summary["mode"]), ("steps", f"{summary['start_step']} -> {summary['steps']}"),
          ("first train loss", summary["first_train_loss"]),
          ("final eval loss", summary["final_eval_loss"]),
          ("compile s", summary["compile_s"]), ("train s", summary["train_s"]),
          ("s / step", summary["s_per_step"])]
  if "tokens_per_s" in summary:
    rows.append(("tokens / s", f"{summary['tokens_per_s']:.0f}"))
  for k in ("phase_steps", "phase_ms_per_step", "backward_passes", "backward_passes_saved",
            "validation_forwards", "predict_fraction", "predict_phases", "rollbacks",
            "health_events", "nonfinite_skipped"):
    if k in summary:
      rows.append((k.replace("_", " "), summary[k]))
  m = summary.get("memory") or {}
  if m:
    fb = memory_lib.format_bytes
    rows += [(f"memory start ({m['source']})", fb(m["start_bytes"])),
             ("memory peak", fb(m["peak_bytes"])), ("memory end", fb(m["end_bytes"])),
             ("memory growth after warm-up", fb(m["growth_bytes"])),
             ("RSS start / peak / end", f"{fb(m['start_rss'])} / {fb(m['peak_rss'])} / {fb(m['end_rss'])}")]
  return format_table(rows, title="run summary")
