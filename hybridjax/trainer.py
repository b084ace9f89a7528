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
from hybridjax import writers

LossFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, Any]]
Batch = Mapping[str, Any]


@flax.struct.dataclass
class TrainState:
  """What a plain optax loop carries."""
  params: Any
  opt_state: Any
  step: jax.Array  # int32 scalar: the global step (batches consumed), which the schedule follows


# --- optimizer ---------------------------------------------------------------------------------

def make_schedule(optim: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warm-up to `learning_rate`, then cosine decay to `learning_rate * min_lr_ratio`."""
  decay_steps = optim.decay_steps or total_steps
  warmup = min(optim.warmup_steps, max(decay_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup > 0 else optim.learning_rate,
      peak_value=optim.learning_rate,
      warmup_steps=warmup,
      decay_steps=max(decay_steps, warmup + 1),
      end_value=optim.learning_rate * optim.min_lr_ratio)


def _decay_mask(params: Any) -> Any:
  """Weight decay on matrices only: not on biases, LayerNorm parameters (ndim < 2)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(optim: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  """The optimizer named by `optim.name`, with clipping and the schedule of `make_schedule`.

  The learning rate is an injected hyperparameter, so its schedule can be made to follow the global
  step (see `sync_schedule`): hybrid training takes steps that never reach the optimizer.
  """
  schedule = make_schedule(optim, total_steps)
  if optim.name == "adamw":
    core = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
        learning_rate=schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps,
        weight_decay=optim.weight_decay, mask=_decay_mask)
  elif optim.name == "adam":
    core = optax.inject_hyperparams(optax.adam)(learning_rate=schedule, b1=optim.b1, b2=optim.b2,
                                                eps=optim.eps)
  elif optim.name == "sgd":
    core = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule, momentum=0.9)
  else:
    raise ValueError(f"--config.optim.name must be 'adamw', 'adam' or 'sgd', got {optim.name!r}")
  if optim.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(optim.grad_clip), core)
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
  return TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))


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


def guarded_update(tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any,
                   step: jax.Array, finite: jax.Array) -> tuple[Any, Any, Any]:
  """One optimizer update that is skipped (params and optimizer state kept) when not `finite`.

  Returns (params, opt_state, updates). The baseline and hybrid real steps share this function,
  so with prediction off they compute bit-identical params (XLA fuses the selects into the update
  arithmetic, so a program without them would round differently).
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
  return TrainState(params=params, opt_state=opt_state, step=state.step + 1), metrics


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation,
                    grad_accum: int = 1) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """`train_step` jitted with `donate_argnums=0`: the old state's buffers are reused in place."""
  def step(state, batch):
    return train_step(state, batch, loss_fn=loss_fn, tx=tx, grad_accum=grad_accum)
  # keep_unused: inputs the step overwrites (the schedule counters) must still be donated.
  return jax.jit(step, donate_argnums=0, keep_unused=True)


def make_eval_fn(loss_fn: LossFn) -> Callable[[Any, Batch], jax.Array]:
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
  total_steps = tcfg.steps
  tx = make_optimizer(config.optim, total_steps)
  rng = jax.random.PRNGKey(config.seed)
  params_rng, hybrid_rng = jax.random.split(rng)

  if config.mode == "baseline":
    def init_state():
      return init_train_state(init_params(params_rng), tx)
    step_fn = make_train_step(loss_fn, tx, tcfg.grad_accum)
    params_of = lambda s: s.params  # noqa: E731
    driver = None
  elif config.mode == "hybrid":
    from hybridjax import steps as hybrid_steps  # the hybrid core
    driver = hybrid_steps.HybridDriver(config, loss_fn=loss_fn, tx=tx, rng=hybrid_rng,
                                       init_params=lambda: init_params(params_rng))
    init_state = driver.init_state
    step_fn = driver.step
    params_of = lambda s: s.train.params  # noqa: E731
  else:
    raise ValueError(f"--config.mode must be 'baseline' or 'hybrid', got {config.mode!r}")

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
    abstract = jax.eval_shape(init_state)
    state, meta = ckpt_lib.restore(manager, latest, abstract)
    start_step = int(meta["step"])
    print(f"resumed from {workdir} at step {start_step}")
  else:
    state = init_state()

  def save(step, state):
    meta = {"step": step, "config": config_json, "mode": config.mode}
    meta.update(extra_meta or {})
    ckpt_lib.save(manager, step, state, meta)

  writer = writers.MetricWriter(workdir)
  eval_fn = make_eval_fn(loss_fn)
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
      batch = train_batch(step)
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
        host = jax.device_get(metrics)  # the only per-log device->host transfer
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
  }
  if tokens_per_step and train_s > 0:
    summary["tokens_per_s"] = timed_steps * tokens_per_step / train_s
  if driver is not None:
    summary.update(driver.summary(state))
  with open(os.path.join(workdir, "summary.json"), "w") as f:
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
            "health_events"):
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
