"""Drivers: what the host loop (`loop.train`) runs in each mode, behind one interface.

`BaselineDriver` runs the plain optax `optim.train_step`; `HybridDriver` runs hybrid training
(`hybridjax.hybrid`). Both own the jitted, donating step functions, build and shard the initial
state, and turn device metrics into log records. `train()` only asks them:

  init_state() / abstract_state() / state_shardings    a fresh state, its shape, its layout
  train_state(state)                                   the `optim.TrainState` inside
  run(state, batches)                                  len(batches) steps (one dispatch)
  health(state)                                        device scalars for the divergence checks
  log_view(state)                                      what a log record reads of the state
  records(metrics, view)                               the log record's fields, plus extra records
  summary(state)                                       the run summary's fields

Hybrid dispatch: with `hybrid.dispatch='switch'` (the default) one dispatch runs the fused step
(`hybrid.step.hybrid_step`), or `hybrid.steps_per_call` of them through `lax.scan`, and never waits on
the device. With 'host' every step reads the on-device branch and calls that transition's own jitted
function, which also gives exact per-phase timings and memory readings at every phase transition.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from hybridjax import memory as memory_lib
from hybridjax import registry
from hybridjax import sharding as sharding_lib
from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid import step as step_lib
from hybridjax.hybrid.context import ControllerSettings, HybridContext
from hybridjax.hybrid.phases import BRANCH_NAMES, EVENT_NAMES, PHASE_NAMES, Phase
from hybridjax.hybrid.state import HybridState
from hybridjax.loop.baseline import make_train_step
from hybridjax.methods import contract
from hybridjax.optim import (
  Batch,
  LossFn,
  Schedule,
  TrainState,
  init_outer_momentum,
  init_train_state,
  make_schedule,
)

Metrics = dict[str, Any]
# The fields of a step's trace record, each read as its type. `discarded`: the framework discarded the
# predicted step (it left a non-finite value in the params or the method's state; the state is the
# one before it).
_TRACE_FIELDS = {
  "step": int,
  "phase": int,
  "branch": int,
  "loss": float,
  "predicted_loss": float,
  "confidence": float,
  "horizon": int,
  "measured": bool,
  "diverged": bool,
  "discarded": bool,
}


def stack_batches(batches: Sequence[Batch]) -> Batch:
  """K batches as one batch whose leaves have a leading axis K (for `hybrid_multi_step`)."""
  return jax.tree.map(lambda *xs: np.stack(xs), *batches)


def make_context(
  hybrid: ml_collections.ConfigDict,
  *,
  loss_fn: LossFn,
  tx: optax.GradientTransformation,
  params_shape: Any,
  total_steps: int,
  grad_accum: int = 1,
  averaging_beta: float | None = None,
  outer: tuple[int, float, float] | None = None,
  method: registry.Method | None = None,
) -> HybridContext:
  """The static `HybridContext` from `config.hybrid` and the (abstract) params: the generic
  controller's settings (with the method's overrides, `method.control`), the method's module and
  its settings (`method.make_settings`). `method`: `hybrid.method`'s record, resolved already
  (default: loaded by its name)."""
  h = hybrid
  method = method or registry.load_method(h.get("method") or registry.DEFAULT_METHOD)
  if method.config_key and method.config_key not in h:  # a user's method with no block: its defaults
    h = ml_collections.ConfigDict(h.to_dict())
    h[method.config_key] = method.default_config()
  groups = groups_lib.param_groups(params_shape, h.grouping)
  settings = method.make_settings(h, groups=groups)
  control = dict(
    enable_predict=bool(h.enable_predict),
    warmup_steps=h.warmup_steps,
    full_steps=h.full_steps,
    max_predict_steps=h.max_predict_steps,
    confidence_threshold=float(h.confidence_threshold),
    correct_steps=h.correct_steps,
    correction_interval=h.correction_interval,
    grad_explosion_factor=float(h.health.grad_explosion_factor),
    loss_spike_sigma=float(h.health.loss_spike_sigma),
    max_prediction_failures=h.health.max_prediction_failures,
    cooldown_steps=h.health.cooldown_steps,
  )
  if method.controller_overrides is not None:
    changes = dict(method.controller_overrides(h, settings))
    unknown = sorted(set(changes) - set(control))
    if unknown:
      raise ValueError(f"method {method.name!r}: control() overrides {unknown}, which are not controller settings")
    control.update(changes)
  return HybridContext(
    loss_fn=loss_fn,
    tx=tx,
    groups=groups,
    control=ControllerSettings(**control),
    grad_accum=grad_accum,
    total_steps=total_steps,
    method=method,
    settings=settings,
    averaging_beta=averaging_beta,
    outer=outer,
  )


def averaging_beta(trainer: ml_collections.ConfigDict) -> float | None:
  """The params average's beta from `config.trainer`, or None when averaging is off."""
  return float(trainer.averaging_beta) if trainer.get("averaging", "none") == "ema" else None


def outer_settings(optim: ml_collections.ConfigDict) -> tuple[int, float, float] | None:
  """Outer momentum's (K, eta, mu) from `config.optim`, or None when `outer_every` is 0."""
  if not optim.get("outer_every", 0):
    return None
  return int(optim.outer_every), float(optim.outer_eta), float(optim.outer_mu)


class _Driver:
  """What both drivers share: the schedule, the params' initializer, the mesh (None on one device),
  the state's shape, and the calls the baseline has nothing to do for."""

  steps_per_call = 1
  reads_position = False  # every step uses one batch and advances the schedule by one
  state_shardings = None  # a tree like the state, on a multi-device mesh

  def __init__(self, config: ml_collections.ConfigDict, init_params: Callable[[], Any], mesh: jax.sharding.Mesh | None):
    self.schedule: Schedule = make_schedule(config.optim, config.trainer.steps)
    self._init_params = init_params
    self.mesh = mesh if sharding_lib.is_multi_device(mesh) else None

  def abstract_state(self) -> Any:
    return jax.eval_shape(self._init_unsharded)

  def pause_timing(self) -> None:
    """Called by the loop before eval/checkpoint work, which is not a step's cost."""

  def progress_fields(self, record: Mapping[str, Any]) -> dict[str, str]:
    del record
    return {}


class BaselineDriver(_Driver):
  """The plain optax loop: `optim.train_step` jitted with the state donated."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    *,
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    init_params: Callable[[], Any],
    mesh: jax.sharding.Mesh | None = None,
  ):
    super().__init__(config, init_params, mesh)
    self.tx = tx  # the run's optimizer (`optim.resolve_optimizer`)
    self._averaging_beta = averaging_beta(config.trainer)
    self._outer = outer_settings(config.optim)
    if self.mesh is not None:
      self.state_shardings = sharding_lib.train_state_shardings(self.abstract_state(), self.mesh)
    # The one baseline step program (`loop.baseline.make_train_step`), as the benchmark's anchors run it.
    self._step = make_train_step(loss_fn, tx, config.trainer.grad_accum, self.state_shardings, self.mesh)

  def _init_unsharded(self) -> TrainState:
    params = self._init_params()
    outer = None if self._outer is None else init_outer_momentum(params, *self._outer)
    return init_train_state(params, self.tx, self._averaging_beta, outer)

  def init_state(self) -> TrainState:
    """A fresh state; on a multi-device mesh created directly with `state_shardings`."""
    if self.mesh is not None:
      return jax.jit(self._init_unsharded, out_shardings=self.state_shardings)()
    return self._init_unsharded()

  @staticmethod
  def train_state(state: TrainState) -> TrainState:
    return state

  @staticmethod
  def position(state: TrainState) -> tuple[int, int]:
    """(schedule step, batches used), read from the device."""
    step = int(jax.device_get(state.step))
    return step, step

  def run(self, state: TrainState, batches: Sequence[Batch]) -> tuple[TrainState, Metrics]:
    """One step per batch; returns the state and the last step's metrics (on the device)."""
    metrics = None
    for batch in batches:
      state, metrics = self._step(state, batch, self.schedule)
    return state, metrics

  def log_view(self, state: TrainState) -> None:
    """Nothing of the state goes into a baseline log record beyond its metrics."""
    del state

  def records(self, metrics: Metrics, view: None) -> tuple[dict[str, Any], list[tuple[int, dict, str]]]:
    """(fields of the train record, extra (step, record, kind) records) from fetched metrics."""
    del view
    return {k: float(v) for k, v in metrics.items()}, []

  def health(self, state: TrainState) -> dict[str, jax.Array]:
    return {"streak": state.nonfinite_streak}

  @staticmethod
  def divergence(health: Mapping[str, Any]) -> tuple[str, str | None]:
    """What failed, for `TrainingDiverged` (nothing to add: every step is a real step), and the
    advice where a method's predicted steps, not the optimizer, did (never)."""
    del health
    return "", None

  def first_loss(self, metrics: Metrics) -> float:
    """The loss of the first step of the first dispatch."""
    return float(jax.device_get(metrics["loss"]))

  def summary(self, state: TrainState) -> dict[str, Any]:
    del state
    return {}


class HybridDriver(_Driver):
  """Hybrid training from the host loop: init, dispatch, per-step trace, memory readings."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    *,
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    rng: jax.Array,
    init_params: Callable[[], Any],
    mesh: jax.sharding.Mesh | None = None,
    method: registry.Method | None = None,
  ):
    """`mesh` (from `sharding.make_mesh`): the state is created and kept sharded on it, and every
    step is jitted with matching in/out shardings. None or one device: plain single-device jit.
    `method`: the config's method record, resolved once by `train()` (default: by its name)."""
    super().__init__(config, init_params, mesh)
    self._rng = rng
    self.ctx = make_context(
      config.hybrid,
      loss_fn=loss_fn,
      tx=tx,
      params_shape=jax.eval_shape(init_params),
      total_steps=config.trainer.steps,
      grad_accum=config.trainer.grad_accum,
      averaging_beta=averaging_beta(config.trainer),
      outer=outer_settings(config.optim),
      method=method,
    )
    self.max_events = config.hybrid.health.max_events
    # A method whose steps may advance the schedule by other than one, or leave their batch: the
    # loop reads the position from the device after each dispatch.
    self.reads_position = self.ctx.method.advances_schedule
    self.dispatch = config.hybrid.dispatch
    self.steps_per_call = config.hybrid.steps_per_call if self.dispatch == "switch" else 1
    if self.mesh is not None:
      if self.steps_per_call > 1:
        raise ValueError(
          "--config.hybrid.steps_per_call > 1 runs on one device only for now; set "
          "--config.hybrid.steps_per_call=1 on a multi-device mesh"
        )
      self.state_shardings = sharding_lib.hybrid_state_shardings(self.abstract_state(), self.mesh, self.ctx.method)
    jit_kw = sharding_lib.step_jit_kwargs(self.state_shardings, self.mesh)
    ctx = self.ctx

    def jit(step: Callable) -> Callable:
      return jax.jit(step, donate_argnums=0, keep_unused=True, **jit_kw)

    self._phase_fns = [jit(step_lib.make_phase_step(ctx, b)) for b in range(len(BRANCH_NAMES))]
    self._fused = jit(lambda s, b, sch: step_lib.hybrid_step(ctx, s, b, sch))
    # Several steps a dispatch run on one device only, where `jit_kw` is empty.
    self._multi = jit(lambda s, b, sch: step_lib.hybrid_multi_step(ctx, s, b, sch))
    self.phase_seconds = np.zeros(len(Phase))
    self.phase_timed_steps = np.zeros(len(Phase), np.int64)
    self._pending: tuple[int, float] | None = None
    self._last_phase: int | None = None
    self._memory_events: list[dict[str, Any]] = []  # readings at phase transitions, for the log
    # Per-step metrics: device references until `flush_trace` fetches them all in one transfer at a
    # log step, so the trace adds no per-step host synchronisation.
    self._trace_device: list[Metrics] = []
    self._trace: list[dict[str, Any]] = []
    # The train record's loss: that of the last measured step (NaN when it was non-finite or the step
    # was discarded), never an older finite one; `_measured` says a step since start-up measured one.
    self._last_measured_loss = float("nan")
    self._measured = False
    self._compiled = False
    self._logged_phase: int | None = None  # the phase at the last log (fused dispatch)

  # --- state -------------------------------------------------------------------------------------

  def _init_unsharded(self) -> HybridState:
    # The params are made as the baseline makes them (eagerly, so both start bit-identical); the
    # rest in one jitted call instead of ~200 small eager dispatches and compiles.
    params = self._init_params()
    return jax.jit(lambda p, r: step_lib.init_hybrid_state(self.ctx, p, r))(params, self._rng)

  def init_state(self) -> HybridState:
    """A fresh state; on a multi-device mesh laid out with `state_shardings`.

    The params are created directly sharded (never whole on one device); the optimizer state and the
    method's params-sized buffers are made from them and keep their sharding. The small replicated
    rest (the method's small state, the controller) is built as on one device, then copied to every
    device.
    """
    if self.mesh is None:
      return self._init_unsharded()
    sh = self.state_shardings
    params = jax.jit(self._init_params, out_shardings=sh.train.params)()
    return jax.device_put(step_lib.init_hybrid_state(self.ctx, params, self._rng), sh)

  def check_method_hooks(self, batch: Batch) -> None:
    """Refuses, before the workdir is made, a user's method whose transitions do not meet the method
    contract on this run's state and first batch (`methods.contract.check_hooks`: traced, nothing is
    compiled or run)."""
    contract.check_hooks(self.ctx, self.abstract_state(), batch, self.schedule)

  @staticmethod
  def train_state(state: HybridState) -> TrainState:
    return state.train

  @staticmethod
  def position(state: HybridState) -> tuple[int, int]:
    """(schedule step, batches used), read from the device: they differ once a step has advanced
    the schedule without using a batch."""
    return tuple(int(x) for x in jax.device_get(HybridDriver.position_on_device(state)))

  @staticmethod
  def position_on_device(state: HybridState) -> tuple[jax.Array, jax.Array]:
    """(schedule step, batches used) as device scalars, for a transfer that fetches them with others."""
    return state.train.step, state.controller.batches

  # --- steps -------------------------------------------------------------------------------------

  def run(self, state: HybridState, batches: Sequence[Batch]) -> tuple[HybridState, Metrics]:
    """len(batches) hybrid steps; returns the state and the last step's metrics (on the device).

    The first call compiles: with host dispatch all three transitions (so that no compile lands in
    a timed phase later), with the fused step the one program this call runs.
    """
    if self.dispatch == "host":
      if not self._compiled:
        self._phase_fns = self.phase_programs(state, batches[0])
        self._compiled = True
      metrics = None
      for batch in batches:
        state, metrics = self._host_step(state, batch)
      return state, metrics
    if len(batches) == 1:
      state, metrics = self._fused(state, batches[0], self.schedule)
      self._trace_device.append(metrics)
      return state, metrics
    state, stacked = self._multi(state, stack_batches(batches), self.schedule)
    self._trace_device.append(stacked)
    return state, jax.tree.map(lambda x: x[-1], stacked)

  def phase_programs(self, state: HybridState, batch: Batch) -> list[Any]:
    """Each transition's own jitted, donating step (indexed by `Branch`), compiled for `state` and
    `batch`, each callable as (state, batch, schedule) -> (state, metrics): what host dispatch runs,
    one program per kind of step."""
    return [f.lower(state, batch, self.schedule).compile() for f in self._phase_fns]

  def _host_step(self, state: HybridState, batch: Batch) -> tuple[HybridState, Metrics]:
    # Reading the branch waits for the previous step: the time since its dispatch is its cost.
    # Python ints at once: on CPU, device_get returns zero-copy views of the device buffers, and a
    # live view keeps XLA from donating them (they would be copied, and the old leaves kept).
    branch, phase, step = (
      int(v) for v in jax.device_get((state.controller.next_branch, state.controller.phase, state.train.step))
    )
    now = time.perf_counter()
    if self._last_phase is not None and phase != self._last_phase:
      # Memory at every phase transition. The pending per-step metrics are fetched first (the device
      # is idle here anyway), so every reading sees the same arrays.
      self.flush_trace()
      snap = memory_lib.memory_snapshot()
      snap.update(step=step, phase_from=PHASE_NAMES[self._last_phase], phase_to=PHASE_NAMES[phase])
      self._memory_events.append(snap)
    self._last_phase = phase
    if self._pending is not None:
      p, t0 = self._pending
      self.phase_seconds[p] += now - t0
      self.phase_timed_steps[p] += 1
    self._pending = (phase, now)
    state, metrics = self._phase_fns[branch](state, batch, self.schedule)
    self._trace_device.append(metrics)
    return state, metrics

  def pause_timing(self) -> None:
    self._pending = None

  # --- records -----------------------------------------------------------------------------------

  def flush_trace(self) -> None:
    """Fetches the per-step metrics held since the last flush into host records."""
    host = jax.device_get(self._trace_device)
    self._trace_device = []
    for m in host:
      steps = np.atleast_1d(m["step"])
      for i in range(len(steps)):
        row = {k: (np.asarray(v)[i] if np.ndim(m["step"]) else v) for k, v in m.items()}
        rec = {k: kind(row[k]) for k, kind in _TRACE_FIELDS.items()}
        if not rec[
          "measured"
        ]:  # only measured steps have a loss; an unvalidated predicted step has its plan's value only
          rec["loss"] = None
        if rec["measured"] or rec["discarded"]:
          # A discarded step has no loss to report as the run's: its state was not kept.
          self._last_measured_loss = float("nan") if rec["discarded"] else rec["loss"]
          self._measured = True
        if rec["phase"] == Phase.PREDICT:
          rec["alpha"] = [round(float(a), 5) for a in row["alpha"]]
        rec.update(self.ctx.method.trace(row, rec["phase"] == Phase.PREDICT))  # the method's fields
        self._trace.append(rec)

  def log_view(self, state: HybridState) -> Any:
    """The controller (phase counts, confidence, health counters) and what the method's log record
    reads of its state (`method.log_view`), fetched with the metrics in the log's one transfer."""
    return state.controller, self.ctx.method.log_view(state.method)

  def records(self, metrics: Metrics, view: Any) -> tuple[dict[str, Any], list[tuple[int, dict, str]]]:
    """(fields of the train record, extra (step, record, kind) records: the per-step trace and the
    memory readings) from fetched metrics and the fetched `log_view`. `loss` is the last measured
    loss: NaN when that was non-finite or the step was discarded (`discarded`: the log's own step),
    never an older finite loss."""
    self.flush_trace()
    trace_only = {"step", "loss", "measured", "diverged", "branch", "discarded"} | set(self.ctx.method.trace_only)
    fields = {
      k: (float(v) if np.ndim(v) == 0 else np.asarray(v, np.float64).round(6).tolist())
      for k, v in metrics.items()
      if k not in trace_only
    }
    c, method_view = jax.device_get(view)  # a no-op on what the loop fetched
    if not self._measured and int(c.real_count) > 0:
      # Resumed into an interval with no measured step yet: the last real step's loss, from the state
      # (a checkpoint is never taken after a non-finite step, so it is the state's current one).
      self._last_measured_loss = float(np.exp(c.last_logloss))
    total = max(int(c.phase_steps.sum()), 1)
    fields.update(
      loss=self._last_measured_loss,
      discarded=bool(metrics["discarded"]),
      phase_now=int(c.phase),
      predict_fraction=float(c.phase_steps[Phase.PREDICT]) / total,
      backward_passes=int(c.backward_passes),
      confidence_now=float(c.confidence),
      health_events=int(c.events.sum()),
      nonfinite_events=int(c.events[0]),
      discarded_steps=int(c.discarded),
      rollbacks=int(c.rollbacks),
    )
    if method_view is not None:
      fields.update(self.ctx.method.log_fields(method_view))
    if self.dispatch == "switch" and self._trace:
      # The fused step never stops between steps: memory is read at a log (`step`: the steps done,
      # the log's own step) whose interval saw the phase change: from the phase at the previous
      # log to the phase now (a change at the interval's last step included).
      phase, step = int(c.phase), self._trace[-1]["step"]
      first = self._trace[0]["phase"] if self._logged_phase is None else self._logged_phase
      if phase != first or any(r["phase"] != first for r in self._trace):
        snap = memory_lib.memory_snapshot()
        snap.update(step=step, phase_from=PHASE_NAMES[first], phase_to=PHASE_NAMES[phase])
        self._memory_events.append(snap)
      self._logged_phase = phase
    extra = [(r.pop("step"), r, "step") for r in self._trace]
    extra += [(e.pop("step"), e, "memory") for e in self._memory_events]
    self._trace, self._memory_events = [], []
    return fields, extra

  def first_loss(self, metrics: Metrics) -> float:
    """The first measured loss of the first dispatch (a fresh run starts with a real step)."""
    del metrics
    self.flush_trace()
    return next((r["loss"] for r in self._trace if r["measured"]), float("nan"))

  def health(self, state: HybridState) -> dict[str, jax.Array]:
    c = state.controller
    return {
      "streak": state.train.nonfinite_streak,
      "events": c.events[0],
      "predicted": c.nonfinite_predicted,
      "discarded": c.discarded,
      "phase": c.phase,
    }

  def divergence(self, health: Mapping[str, Any]) -> tuple[str, str | None]:
    """What failed, for `TrainingDiverged`, from the fetched `health`: the non-finite events by the
    kind of step that raised them, naming the method and the phase; and the advice where the method's
    predicted steps, rather than the real steps, raised most of them (else None)."""
    name = self.ctx.method.name
    events, predicted, discarded = (int(health[k]) for k in ("events", "predicted", "discarded"))
    real = events - predicted
    phase = PHASE_NAMES[int(health["phase"])]
    if not predicted:
      return f", all of them real steps of method {name!r} (a non-finite loss or gradient; now in {phase})", None
    kept = (
      f"; {discarded} discarded: they left a non-finite value in the params or the method's state, "
      "and the state before them was kept"
      if discarded
      else ""
    )
    text = f", {predicted} of them predicted steps of method {name!r} (PREDICT{kept}) and {real} real steps"
    if predicted < real:
      return text, None
    return text, (
      f"The predicted steps of method {name!r} raised most of them, not the optimizer's updates: check the method, "
      "or train without predicted steps (--config.hybrid.enable_predict=False)."
    )

  def progress_fields(self, record: Mapping[str, Any]) -> dict[str, str]:
    """Progress-bar fields from a train record (no second device read): none for a method that never
    predicts (its control turns PREDICT off), whose phases and confidence say nothing."""
    if not self.ctx.control.enable_predict:
      return {}
    return {
      "phase": PHASE_NAMES[int(record["phase_now"])],
      "pred": f"{record['predict_fraction']:.0%}",
      "conf": f"{record['confidence_now']:.2f}",
    }

  def summary(self, state: HybridState) -> dict[str, Any]:
    c, method_state = jax.device_get((state.controller, state.method))
    steps = int(c.phase_steps.sum())
    # A discarded predicted step took no backward pass, but its move was thrown away: the run trained
    # as if it had not been taken, so it saved nothing.
    predicted, discarded = steps - int(c.backward_passes), int(c.discarded)
    out = {
      "phase_steps": {n: int(v) for n, v in zip(PHASE_NAMES, c.phase_steps)},
      "backward_passes": int(c.backward_passes),
      "backward_passes_saved": predicted - discarded,
      "predicted_steps_discarded": discarded,
      "validation_forwards": int(c.forward_passes),
      "predict_fraction": float(c.phase_steps[Phase.PREDICT]) / max(steps, 1),
      "predict_phases": int(c.predict_phases),
      "rollbacks": int(c.rollbacks),
      "health_events": {n: int(v) for n, v in zip(EVENT_NAMES, c.events)},
      "group_names": list(self.ctx.groups.names),  # the order of the per-group vectors in logs
      "dispatch": self.dispatch,
      "steps_per_call": self.steps_per_call,
      "method": self.ctx.method.name,
      "predicts": bool(self.ctx.control.enable_predict),  # False: PREDICT is off (a method that never predicts)
    }
    if discarded and 2 * discarded >= predicted:
      out["warnings"] = [
        f"{discarded} of the {predicted} predicted steps of method {self.ctx.method.name!r} were discarded (they "
        "left a non-finite value in the params or the method's state, and the state before them was kept): they "
        f"saved no backward pass, and the run trained on its real steps alone (predict fraction "
        f"{out['predict_fraction']:.0%} counts the steps taken in PREDICT, kept or not)"
      ]
    own = self.ctx.method.summary(self.ctx, method_state, c)
    out.update(own, method_summary=own)  # the same fields, and grouped: what the benchmark keeps of a run
    if self.dispatch == "host" and self.phase_timed_steps.sum() > 0:
      out["phase_seconds"] = {n: round(float(s), 3) for n, s in zip(PHASE_NAMES, self.phase_seconds)}
      out["phase_ms_per_step"] = {
        n: round(1e3 * float(s) / int(k), 2)
        for n, s, k in zip(PHASE_NAMES, self.phase_seconds, self.phase_timed_steps)
        if k > 0
      }
    return out
