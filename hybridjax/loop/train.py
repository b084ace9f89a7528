"""The host loop: resume or start, dispatch steps, and do the periodic work when it is time.

`train()` runs either mode through a driver (`loop.drivers`): the plain optax baseline, or hybrid
training. It reads as "if it is time: do X": log (the only device->host transfer of metrics),
evaluate, checkpoint. A dispatch never crosses a log, eval or checkpoint step, so those happen at
dispatch boundaries that fall on their intervals.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hybridjax import checkpoint as ckpt_lib
from hybridjax import config as config_lib
from hybridjax import memory as memory_lib
from hybridjax import preflight, registry, schema, writers
from hybridjax import sharding as sharding_lib
from hybridjax.loop import fingerprint as fingerprint_lib
from hybridjax.loop import resume as resume_lib
from hybridjax.loop.drivers import BaselineDriver, HybridDriver
from hybridjax.loop.evaluation import evaluate, evaluate_state, make_eval_fn  # noqa: F401 (API)
from hybridjax.loop.interrupts import Stopwatch, TrainingInterrupted, _Interrupts  # noqa: F401 (API)
from hybridjax.optim import Batch, LossFn, Optimizer, all_finite, resolve_optimizer
from hybridjax.optimizers import user as user_optimizer
from hybridjax.writers import format_loss, format_summary


class TrainingDiverged(RuntimeError):
  """Raised by `train` when updates stay non-finite (`trainer.max_nonfinite_steps` in a row, or
  `hybrid.health.max_events` non-finite events, the message saying how many came from the method's
  predicted steps and from real steps); no checkpoint of the diverged state is written."""


def enable_compile_cache(trainer_cfg: ml_collections.ConfigDict) -> str | None:
  """Turns on JAX's persistent compilation cache (cuts CPU compile time severalfold on reruns)."""
  if not trainer_cfg.compile_cache:
    return None
  path = trainer_cfg.compile_cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "hybridjax", "jax_cache")
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


def make_driver(
  config: ml_collections.ConfigDict,
  *,
  init_params: Callable[[jax.Array], Any],
  loss_fn: LossFn,
  mesh: jax.sharding.Mesh | None = None,
  tx: Optimizer | None = None,
  method: registry.Method | None = None,
) -> BaselineDriver | HybridDriver:
  """The driver of `config.mode`, with params from `init_params(PRNGKey(seed) split)` and the
  optimizer `optim.resolve_optimizer(config.optim, params, tx)`; a hybrid driver runs `method` (the
  config's, resolved already; default: by its name). A user's `tx` that the config's schedule cannot
  drive is refused (`user_optimizer.check_user_optimizer`: only traced, nothing is computed)."""
  params_rng, hybrid_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  params_shape = jax.eval_shape(init_params, params_rng)
  resolved = resolve_optimizer(config.optim, params_shape, tx)
  if tx is not None:
    user_optimizer.check_user_optimizer(resolved, params_shape, config.optim)

  init = functools.partial(init_params, params_rng)
  schema.raise_invalid(schema.errors("", [config_lib.MODE], config))
  if config.mode == "baseline":
    return BaselineDriver(config, loss_fn=loss_fn, tx=resolved, init_params=init, mesh=mesh)
  return HybridDriver(config, loss_fn=loss_fn, tx=resolved, rng=hybrid_rng, init_params=init, mesh=mesh, method=method)


def step_batches(
  config: ml_collections.ConfigDict, train_batch: Callable[[int], Batch], method: registry.Method | None = None
) -> Callable[[int], Batch]:
  """`train_batch` as the steps of `config`'s method (`method`, resolved already; default: by its
  name) receive it: for a method that declares `BATCHES_PER_STEP = k` > 1, step i gets the task's
  batches k*i .. k*i+k-1 concatenated along the batch axis (deterministic in the step, so a resumed
  run sees the same data); otherwise unchanged."""
  k = (method or config_lib.resolve_method(config)).batches_per_step if config.mode == "hybrid" else 1
  if k == 1:
    return train_batch

  def batch(i: int) -> Batch:
    parts = [train_batch(k * i + j) for j in range(k)]
    # Leaves along the batch axis (the leading axis most leaves share) are joined; the others (a
    # shared key, a scale) are the first batch's. Device arrays stay on the device.
    leading = [np.shape(x)[0] for x in jax.tree.leaves(parts[0]) if np.ndim(x)]
    size = max(set(leading), key=leading.count) if leading else None

    def join(*xs):
      if not np.ndim(xs[0]) or np.shape(xs[0])[0] != size:
        return xs[0]
      return jnp.concatenate(xs) if isinstance(xs[0], jax.Array) else np.concatenate([np.asarray(x) for x in xs])

    return jax.tree.map(join, *parts)

  return batch


def check_loss_fn(loss_fn: LossFn, init_params: Callable[[jax.Array], Any], batch: Batch, seed: int = 0) -> None:
  """Traces `loss_fn(params, batch)` on the abstract params (`jax.eval_shape`: nothing is run) and
  refuses, naming `loss_fn` and its contract, one that fails or does not return `(scalar loss, aux)`."""
  contract = "loss_fn(params, batch) -> (loss, aux): a scalar mean loss and a pytree of extras ({} for none)"
  params = jax.eval_shape(init_params, jax.random.PRNGKey(seed))
  try:
    out = jax.eval_shape(loss_fn, params, batch)
  except Exception as e:  # noqa: BLE001 (the user's code: any error it raises is its own)
    raise ValueError(
      f"loss_fn fails when traced on init_params' params and train_batch(0) ({contract}): {type(e).__name__}: {e}"
    ) from e
  if not (isinstance(out, tuple) and len(out) == 2):
    got = (
      f"an array of shape {tuple(out.shape)}"
      if hasattr(out, "shape")
      else f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, tuple) else "")
    )
    raise ValueError(f"loss_fn must be {contract}; it returned {got} (a loss alone: return (loss, {{}}))")
  loss = out[0]
  if not hasattr(loss, "shape") or loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
    raise ValueError(
      f"loss_fn must be {contract}; its loss is {getattr(loss, 'shape', type(loss).__name__)} "
      f"{getattr(loss, 'dtype', '')} (take the mean over the batch)"
    )


def check_batch_counts(trainer_cfg: ml_collections.ConfigDict, batch: Batch, eval_batches: Sequence[Batch]) -> None:
  """Refuses a run whose batches are not the ones its config states.

  `train()` takes the user's batches as given, so `trainer.batch_size` and `trainer.eval_batches`
  do not shape them; but the run's record states both, and `trainer.grad_accum` and the mesh split
  the batch by `trainer.batch_size`. A config left at its defaults beside batches of another size
  would train as asked and record a batch size it never used. The batch size is read from
  `batch`'s leading dimension where every leaf with one agrees on it (a batch whose leaves differ
  there is not one this check can read).
  """
  leading = {int(np.shape(x)[0]) for x in jax.tree_util.tree_leaves(batch) if np.ndim(x) >= 1}
  if len(leading) == 1 and (size := leading.pop()) != int(trainer_cfg.batch_size):
    raise ValueError(
      f"train_batch(0) gives batches of {size} examples, but config.trainer.batch_size is "
      f"{trainer_cfg.batch_size}: the run's record states the batch size, and trainer.grad_accum and the "
      f"mesh split the batch by it. Set config.trainer.batch_size = {size}"
    )
  if len(eval_batches) != int(trainer_cfg.eval_batches):
    raise ValueError(
      f"train(eval_batches=...) holds {len(eval_batches)} held-out batches, but config.trainer.eval_batches "
      f"is {trainer_cfg.eval_batches}: the run's record states how many its eval loss averages. Set "
      f"config.trainer.eval_batches = {len(eval_batches)}"
    )
  accum, size = int(trainer_cfg.get("grad_accum", 1)), int(trainer_cfg.batch_size)
  if accum > 1:
    # `optim.loss_and_grads` reshapes every leaf's first axis into micro-batches: a leaf without a
    # batch axis (class weights, a key) would be cut into pieces, each micro-batch seeing a part.
    shared = [
      f"{jax.tree_util.keystr(path)} {np.shape(x)}"
      for path, x in jax.tree_util.tree_leaves_with_path(batch)
      if np.ndim(x) < 1 or np.shape(x)[0] != size
    ]
    if shared:
      raise ValueError(
        f"--config.trainer.grad_accum={accum} splits every leaf of the batch along its first axis into {accum} "
        f"micro-batches, but train_batch(0)'s {', '.join(shared)} have no batch axis of {size}: each micro-batch "
        "would see a piece of them. Give every leaf a leading batch axis (repeat a shared value per example), "
        "or set config.trainer.grad_accum = 1"
      )


def check_position(method: registry.Method, device: tuple[int, int], counted: tuple[int, int]) -> None:
  """Refuses a run whose method moved the schedule or the data other than the loop counts them.

  Without `ADVANCES_SCHEDULE` the loop does not read the position from the device: it counts one
  schedule step and one batch per step. A step that advances the schedule by other than one (a
  predicted step that moves the params without `optim.moved_train_state`) or leaves its batch
  (`StepInfo.batch_consumed=False`) would then train on other batches than the method chose, or stop
  at another schedule step, with no sign of it. `device` is (schedule step, batches used) as the
  device holds them (`driver.position`), `counted` the loop's own count.
  """
  if tuple(device) == tuple(counted):
    return
  (device_step, device_batches), (step, batches) = device, counted
  raise ValueError(
    f"method {method.name!r} ({method.path}): after {step} steps the device holds schedule step {device_step} and "
    f"{device_batches} batches used, where the loop counted {step} and {batches} (one of each per step, "
    "as a method without ADVANCES_SCHEDULE declares). A step that leaves its batch "
    "(StepInfo batch_consumed=False) or advances the schedule by other than one needs "
    f"ADVANCES_SCHEDULE = True in {method.path}; a predicted step must move the params through "
    "optim.moved_train_state, which advances the schedule by one (docs/methods.md)"
  )


def _is_time(before: int, done: int, every: int, total: int) -> bool:
  """True when the schedule step went from `before` to `done` across a multiple of `every`, or
  reached the end (a step that advances the schedule by k can cross an interval without landing on it)."""
  return (every > 0 and done // every != before // every) or done >= total


def _next_boundary(step: int, total: int, intervals: Iterable[int]) -> int:
  """The first step after `step` at which a log, eval or checkpoint is due (or the run ends)."""
  return min([total] + [(step // n + 1) * n for n in intervals if n > 0])


def _preflight(
  config: ml_collections.ConfigDict,
  init_params: Callable[[jax.Array], Any],
  loss_fn: LossFn,
  train_batch: Callable[[int], Batch],
  eval_batches: Sequence[Batch],
  tx: Optimizer | None,
  reference_configs: Sequence[ml_collections.ConfigDict] | None,
) -> tuple[ml_collections.ConfigDict, registry.Method, Any, Callable[[int], Batch], list[Batch], Any]:
  """Every check of a run before anything is written: the config (`preflight.check_config`), the
  loss and the batches on the first batch, the driver built (the optimizer resolved, the method's
  hooks traced on a batch), the settings the run would not read. It compiles nothing it keeps and
  writes nothing. Returns the working config (locked, with the method's block), the method, the
  driver, the step's batches, the held-out batches and the device mesh."""
  # The method, resolved once (every part below gets its record); its block at its defaults where
  # the config has none (a user's method).
  method = config_lib.resolve_method(config)
  config = config_lib.with_method_block(ml_collections.ConfigDict(config.to_dict()), method)
  config.lock()  # the working copy: nothing below adds a key to it
  preflight.check_config(config, method)
  eval_batches = list(eval_batches)
  if not eval_batches:
    raise ValueError(
      "train(eval_batches=[]): no held-out batch to evaluate on, so the run's final_eval_loss would be NaN; "
      "pass eval_batches=[batch, ...], at least one fixed held-out batch"
    )
  enable_compile_cache(config.trainer)
  # Multi-host start-up (a no-op unless config.distributed.enabled), then the device mesh.
  sharding_lib.initialize_distributed(config)
  mesh = sharding_lib.make_mesh(config)
  first_batch = train_batch(0)
  check_loss_fn(loss_fn, init_params, first_batch, config.seed)
  check_batch_counts(config.trainer, first_batch, eval_batches)
  driver = make_driver(config, init_params=init_params, loss_fn=loss_fn, mesh=mesh, tx=tx, method=method)
  train_batch = step_batches(config, train_batch, method)
  if reference_configs is not None or "preset" not in config:
    control = None
    if isinstance(driver, HybridDriver) and method.controller_overrides is not None:
      control = method.controller_overrides(config.hybrid, driver.ctx.settings)
    preflight.check_inert_settings(config, method, reference_configs, control=control)
  if isinstance(driver, HybridDriver):
    driver.check_method_hooks(train_batch(0))
  return config, method, driver, train_batch, eval_batches, mesh


class _Run:
  """One run's host loop: the state and the counters between dispatches, and each periodic action
  (`log`, `evaluate`, `checkpoint`, `check_health`, `stop`) as a function of them."""

  def __init__(self, config, method, driver, manager, workdir: str, state: Any, position: tuple[int, int], mesh: Any):
    self.config, self.tcfg, self.method, self.driver, self.manager = config, config.trainer, method, driver, manager
    self.workdir, self.state, self.mesh = workdir, state, mesh
    self.step, self.batch_index = position
    self.start_step = self.step
    self.params_finite = jax.jit(all_finite)  # a separate program: the step's own rounding is untouched
    self.first_loss, self.last_evals, self.compile_s = None, {}, 0.0
    self.clock = Stopwatch()
    self.timed_steps = self.steps_since_log = 0
    self.logged_s = 0.0  # clock.total at the last log
    self.memory_warned = False
    # Multi-host: checkpoints are shared (orbax writes each process's shards); logs are not, so every
    # process but the first writes its own under process_<i>/.
    i = jax.process_index()
    self.log_dir = workdir if i == 0 else os.path.join(workdir, f"process_{i}")
    self.writer = writers.MetricWriter(self.log_dir, keep_through=self.step)
    self.mem = memory_lib.MemoryTracker()
    self.mem.record()
    self.bar = None
    if self.tcfg.progress:
      from tqdm.auto import tqdm

      self.bar = tqdm(total=self.tcfg.steps, initial=self.step, dynamic_ncols=True, unit="step")

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
    self.writer.close()
    self.manager.close()

  def save(self, step: int) -> None:
    ckpt_lib.save(self.manager, step, self.state, {"step": step, "batches": self.batch_index, **self.meta})

  def dispatch(self, train_batch: Callable[[int], Batch], n: int) -> int:
    """Runs the next `n` steps; returns the schedule step before them."""
    driver, before = self.driver, self.step
    batches = [
      sharding_lib.shard_batch(train_batch(i), self.mesh) for i in range(self.batch_index, self.batch_index + n)
    ]
    if before == self.start_step:
      # The first dispatch compiles; block so its time is not charged to training.
      t0 = time.perf_counter()
      self.state, self.metrics = driver.run(self.state, batches)
      jax.block_until_ready(self.state)
      self.compile_s = time.perf_counter() - t0
      # Fetched now, so the host records hold no device buffers: memory readings stay exact.
      self.first_loss = driver.first_loss(self.metrics)
      self.mem.mark_after_warmup()
    else:
      self.clock.resume()
      self.state, self.metrics = driver.run(self.state, batches)
      self.steps_since_log += n
    # A method's step may advance the schedule by other than one or leave its batch, as the device
    # decided (`ADVANCES_SCHEDULE`): then both counters are read (one small transfer per step).
    self.step, self.batch_index = (
      driver.position(self.state) if driver.reads_position else (self.step + n, self.batch_index + n)
    )
    if self.bar is not None:
      self.bar.update(self.step - before)
    return before

  def log(self, tokens_per_step: int | None, hooks: Mapping[str, Callable]) -> None:
    """Writes the train record (the only per-log device->host transfer: the metrics, the health
    counters, the log view, and the position where the loop counts it itself, `check_position`)."""
    driver, state, step = self.driver, self.state, self.step
    checks_position = isinstance(driver, HybridDriver) and not driver.reads_position
    host, health, view, position = jax.device_get(
      (
        self.metrics,
        driver.health(state),
        driver.log_view(state),
        driver.position_on_device(state) if checks_position else (),
      )
    )
    if checks_position:
      check_position(self.method, tuple(int(x) for x in position), (step, self.batch_index))
    record, extra = driver.records(host, view)
    jax.block_until_ready(state)
    self.clock.pause()
    span, self.logged_s = self.clock.total - self.logged_s, self.clock.total  # training seconds since the last log
    self.timed_steps += self.steps_since_log
    snap = self.mem.record()
    record["steps_per_s"] = self.steps_since_log / max(span, 1e-9)
    record["train_s"] = self.clock.total  # cumulative training seconds (no compile, eval or checkpoint)
    if tokens_per_step:
      record["tokens_per_s"] = self.steps_since_log * tokens_per_step / max(span, 1e-9)
    record.update(
      bytes_in_use=snap["bytes_in_use"], rss_bytes=snap["rss_bytes"], nonfinite_streak=int(health["streak"])
    )
    self.writer.write(step, record)
    for rec_step, rec, kind in extra:
      if kind == "memory":
        self.mem.observe(rec)
      self.writer.write(rec_step, rec, kind=kind)
    if "on_log" in hooks:
      hooks["on_log"](step, record)
    self.check_health(health)
    if self.bar is not None:
      post = {"loss": format_loss(record), **driver.progress_fields(record)}
      if tokens_per_step:
        post["tok/s"] = f"{record['tokens_per_s']:.0f}"
      post["mem"] = memory_lib.format_bytes(snap["bytes_in_use"])
      self.bar.set_postfix(post, refresh=False)
    limit = self.tcfg.memory_limit_bytes
    if limit and snap["bytes_in_use"] > limit and not self.memory_warned:
      self.memory_warned = True
      print(
        f"WARNING: memory in use {snap['bytes_in_use']} B exceeds "
        f"trainer.memory_limit_bytes={limit}; saving an emergency checkpoint"
      )
      self.save(step)
    self.steps_since_log = 0

  def evaluate(self) -> None:
    """Evaluates the run's model on the held-out batches and writes the eval record."""
    self.clock.pause()
    self.driver.pause_timing()
    self.last_evals = evaluate_state(self.eval_fn, self.driver.train_state(self.state), self.eval_batches)
    # The count the eval loss averages: `trainer.eval_batches` may change on a resume.
    self.writer.write(self.step, {**self.last_evals, "eval_batches": len(self.eval_batches)}, kind="eval")
    if self.bar is not None:
      self.bar.write(f"step {self.step}: eval loss {self.last_evals['eval_loss']:.4f}")

  def checkpoint(self) -> None:
    """Saves the state once its params are checked finite; keeps the previous checkpoint where the
    last real step was skipped as non-finite."""
    self.clock.pause()
    self.driver.pause_timing()
    train_state = self.driver.train_state(self.state)
    health, params_ok = jax.device_get((self.driver.health(self.state), self.params_finite(train_state.params)))
    self.check_health(health, bool(params_ok))
    if int(health["streak"]):
      print(f"step {self.step}: checkpoint skipped, the last {int(health['streak'])} step(s) were non-finite")
    else:
      self.save(self.step)

  def stop(self, signum: int) -> None:
    """On SIGINT or SIGTERM: saves the state at this step (unless its last step was non-finite: the
    previous checkpoint is kept) and raises `TrainingInterrupted`."""
    self.clock.pause()
    saved = not int(jax.device_get(self.driver.health(self.state))["streak"])
    if saved and self.manager.latest_step() != self.step:
      self.save(self.step)
    self.manager.wait_until_finished()
    raise TrainingInterrupted(signum, self.step, saved, self.workdir)

  def check_health(self, health: Mapping[str, Any], params_ok: bool = True) -> None:
    """Raises TrainingDiverged when the non-finite limits are reached; nothing more is saved."""
    tcfg, driver, done = self.tcfg, self.driver, self.step
    streak, events = int(health["streak"]), health.get("events")
    advice = None
    if not params_ok:  # only an absurd learning rate gets here: every skipped update is checked
      reason = f"the params became non-finite by step {done}"
    elif streak >= tcfg.max_nonfinite_steps:
      reason = (
        f"the last {streak} steps (up to step {done}) had a non-finite loss or gradient "
        f"and their updates were skipped (limit --config.trainer.max_nonfinite_steps="
        f"{tcfg.max_nonfinite_steps})"
      )
    elif events is not None and int(events) >= driver.max_events:
      # Which steps raised them: a method's predicted steps (discarded when they made the params
      # non-finite) or real steps; the advice follows whichever raised most.
      account, advice = driver.divergence(health)
      reason = (
        f"{int(events)} non-finite events by step {done} (limit --config.hybrid.health.max_events="
        f"{driver.max_events}){account}"
      )
    else:
      return
    self.manager.wait_until_finished()  # earlier saves complete: they hold finite, good states
    last = self.manager.latest_step()
    kept = (
      "no checkpoint had been written yet"
      if last is None
      else f"the last good checkpoint, step {last}, is kept in {self.manager.directory} (to continue "
      "from it with a changed config, add --config.resume=force)"
    )
    lower = f"lower --config.optim.learning_rate (now {self.config.optim.learning_rate}) or check the data."
    method = self.method
    if advice is None and isinstance(driver, HybridDriver) and method.full_step is not None:
      if method.path not in registry.BUILTIN_METHODS.values():  # a user's method: its real step is its own
        advice = (
          f"Method {method.name!r} takes its real steps with its own full_step ({method.path}): check it, or {lower}"
        )
    raise TrainingDiverged(
      f"training diverged: {reason}. No checkpoint of the diverged state was written; {kept}. "
      f"{advice or 'L' + lower[1:]}"
    )

  def summary(self, tokens_per_step: int | None) -> dict[str, Any]:
    """The run summary, written to `<log dir>/summary.json`."""
    gc.collect()  # orbax's save leaves reference cycles holding device copies until collected
    self.mem.record()
    clock, driver = self.clock, self.driver
    summary: dict[str, Any] = {
      "mode": self.config.mode,
      "steps": self.tcfg.steps,
      "start_step": self.start_step,
      "batches": self.batch_index,  # batches used: fewer than the steps when the method skipped schedule steps
      "first_train_loss": self.first_loss,
      "final_eval_loss": self.last_evals.get("eval_loss"),  # the averaged params when trainer.averaging='ema'
      **{f"final_{k}": v for k, v in self.last_evals.items() if k != "eval_loss"},
      "compile_s": self.compile_s,
      "train_s": clock.total,
      "s_per_step": clock.total / max(self.timed_steps, 1),
      "memory": self.mem.summary(),
      "mesh": sharding_lib.describe(self.mesh),
      # Real steps whose update was skipped as non-finite (never applied to the params).
      "nonfinite_skipped": int(jax.device_get(driver.train_state(self.state).nonfinite_total)),
    }
    # The run's code fingerprint (`fingerprint.fingerprint`), and where a resume changed trainer.steps (under
    # resume='force') or the code (hybridjax's, or the run's own under resume='force').
    summary.update({k: v for k, v in self.meta.items() if k in ("steps_changes", "code", "code_changes")})
    if tokens_per_step and clock.total > 0:
      summary["tokens_per_s"] = self.timed_steps * tokens_per_step / clock.total
    summary.update(driver.summary(self.state))
    with open(os.path.join(self.log_dir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2, default=str)
    return summary


def train(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  init_params: Callable[[jax.Array], Any],
  loss_fn: LossFn,
  train_batch: Callable[[int], Batch],
  eval_batches: list[Batch],
  tx: Optimizer | None = None,
  tokens_per_step: int | None = None,
  extra_meta: dict | None = None,
  hooks: Mapping[str, Callable] | None = None,
  save_on_interrupt: bool = True,
  reference_configs: Sequence[ml_collections.ConfigDict] | None = None,
) -> dict[str, Any]:
  """Trains `config.mode` ('baseline' or 'hybrid') for `config.trainer.steps` steps.

  Args:
    config: a validated experiment config (see `hybridjax.config`).
    workdir: checkpoints, metrics.jsonl, TensorBoard files and summary.json go here. If it holds a
      checkpoint, training resumes from it (see `config.resume`).
    init_params: rng -> params.
    loss_fn: (params, batch) -> (loss, aux).
    train_batch: step -> batch; must be deterministic in the step so a resumed run sees the same data.
    eval_batches: fixed held-out batches (at least one: the run's final_eval_loss is their mean loss).
    tx: an optimizer of your own, instead of the one `config.optim` builds: an optax
      transformation with an injected learning rate (`optax.inject_hyperparams`), or a factory
      `learning_rate -> transformation`. The config's schedule drives its learning rate, and
      `config.optim.name` must name it (not a built-in name): see `optim.resolve_optimizer`.
    tokens_per_step: for the tokens/s figure.
    extra_meta: JSON-able facts stored with every checkpoint (e.g. the data source).
    hooks: optional callbacks; `on_log(step, record)` is called at every log.
    save_on_interrupt: on SIGINT (Ctrl-C) or SIGTERM, save the state at the end of the step under
      way and raise `TrainingInterrupted` (in the main thread only; a second Ctrl-C aborts at once).
      False: the signals keep their handlers (a benchmark worker, whose unit of resume is the run).
    reference_configs: the configs whose hybrid values count as not set, for the refusal of hybrid
      settings the run would not read (`preflight.inert_setting_errors`): default
      `hybridjax.default_config(mode, method)`. An experiment program passes its presets' (which tune
      the hybrid block in either mode); an experiment config (one with a `preset`) given none is
      not checked so.

  Returns:
    The run summary (also written to `<workdir>/summary.json`).
  """
  own = {"loss_fn": loss_fn, "train_batch": train_batch, "init_params": init_params, "tx": tx}  # the user's own code
  config, method, driver, train_batch, eval_batches, mesh = _preflight(
    config, init_params, loss_fn, train_batch, eval_batches, tx, reference_configs
  )
  tcfg = config.trainer
  code = fingerprint_lib.fingerprint(own, method, config.mode, loop_module=__name__)
  os.makedirs(workdir, exist_ok=True)  # only once the config, the loss and the method's hooks are checked
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"), max_to_keep=tcfg.max_to_keep)
  try:
    state, position, finished, changes = resume_lib.resume_or_init(config, workdir, driver, manager, code)
  except BaseException:
    manager.close()
    raise
  if finished is not None:  # a finished run: report it, and do not overwrite its summary
    manager.close()
    print(resume_lib.finished_message(config, workdir, int(finished.get("steps", position[0]))))
    return finished

  run = _Run(config, method, driver, manager, workdir, state, position, mesh)
  run.meta = {
    "config": json.loads(config.to_json()),
    "mode": config.mode,
    "code": code,
    **changes,
    **(extra_meta or {}),
  }
  run.eval_fn, run.eval_batches = make_eval_fn(loss_fn, mesh), [sharding_lib.shard_batch(b, mesh) for b in eval_batches]
  intervals = (tcfg.log_every, tcfg.eval_every, tcfg.checkpoint_every)
  try:
    with _Interrupts(save_on_interrupt) as interrupts:
      while run.step < tcfg.steps:
        if interrupts.signum is not None:
          run.stop(interrupts.signum)
        n = min(driver.steps_per_call, _next_boundary(run.step, tcfg.steps, intervals) - run.step)
        due = functools.partial(_is_time, run.dispatch(train_batch, n), run.step, total=tcfg.steps)
        if due(tcfg.log_every):
          run.log(tokens_per_step, hooks or {})
        if due(tcfg.eval_every):
          run.evaluate()
        if due(tcfg.checkpoint_every):
          run.checkpoint()
      manager.wait_until_finished()
  finally:
    run.close()
  summary = run.summary(tokens_per_step)
  print(format_summary(summary))
  return summary
