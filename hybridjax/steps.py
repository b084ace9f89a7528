"""The hybrid step functions (DESIGN.md sections 1-2).

Three step kinds, each a pure `(state, batch) -> (state, info)`:

  real_step            forward + backward + optimizer update (WARMUP, FULL, CORRECT and
                       micro-corrections). Updates the velocity, the history, trains the dynamics
                       model one step, and imagines the plan the next PREDICT phase will follow.
  predict_step         no backward pass: theta <- theta + sum_g alpha_{g,k} velocity_g, with a
                       forward-pass validation every `validate_every` steps and at the horizon.
  correct_entry_step   the first CORRECT step: rolls back the diverged part of the segment exactly
                       (theta -= sum_g A_g velocity_g, A the summed alphas), trains the corrector,
                       then takes a real step.

`hybrid_step` selects one with `lax.switch` on the on-device `next_branch` and applies the controller
transition; `HybridDriver` runs them from the host, either through that fused step or by dispatching
to the three separately jitted (and donating) functions.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from hybridjax import controller as controller_lib
from hybridjax import corrector as corrector_lib
from hybridjax import dynamics as dynamics_lib
from hybridjax import features as features_lib
from hybridjax import memory as memory_lib
from hybridjax import sharding as sharding_lib
from hybridjax import state as state_lib
from hybridjax.config import PHASE_NAMES
from hybridjax.state import HybridState
from hybridjax.trainer import (current_learning_rate, global_norm, guarded_update, init_train_state,
                               loss_and_grads, next_train_state, tree_where)

LossFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, Any]]


@dataclasses.dataclass(frozen=True)
class HybridContext:
  """Everything static the step functions close over."""
  loss_fn: LossFn
  tx: optax.GradientTransformation
  groups: features_lib.ParamGroups
  control: controller_lib.ControllerSettings
  rssm: dynamics_lib.RSSMConfig
  grad_accum: int
  velocity_beta: float
  constant_alpha: float
  window: int
  total_steps: int
  corrector_hidden: int
  corrector_lr: float
  corrector_capacity: int
  accuracy_window: int
  history_size: int

  @property
  def hmax(self) -> int:
    return self.control.max_predict_steps


def make_context(hybrid: ml_collections.ConfigDict, *, loss_fn: LossFn,
                 tx: optax.GradientTransformation, params_shape: Any, total_steps: int,
                 grad_accum: int = 1) -> HybridContext:
  """Builds the static context from `config.hybrid` and the (abstract) params."""
  groups = features_lib.param_groups(params_shape, hybrid.grouping)
  h = hybrid
  control = controller_lib.ControllerSettings(
      enable_predict=bool(h.enable_predict), warmup_steps=h.warmup_steps, full_steps=h.full_steps,
      max_predict_steps=h.max_predict_steps, confidence_threshold=float(h.confidence_threshold),
      divergence_tolerance=float(h.divergence_tolerance), correct_steps=h.correct_steps,
      correction_interval=h.correction_interval, validate_every=h.validate_every,
      grad_explosion_factor=float(h.health.grad_explosion_factor),
      loss_spike_sigma=float(h.health.loss_spike_sigma),
      max_prediction_failures=h.health.max_prediction_failures,
      cooldown_steps=h.health.cooldown_steps)
  rssm = dynamics_lib.RSSMConfig(
      feature_dim=groups.feature_dim, n_groups=groups.n_groups, deter=h.rssm.deter,
      latent=h.rssm.latent, hidden=h.rssm.hidden, ensemble=h.rssm.ensemble,
      free_bits=float(h.rssm.free_bits), learning_rate=float(h.rssm.learning_rate))
  return HybridContext(
      loss_fn=loss_fn, tx=tx, groups=groups, control=control, rssm=rssm, grad_accum=grad_accum,
      velocity_beta=float(h.velocity_beta), constant_alpha=float(h.constant_alpha),
      window=h.window, total_steps=total_steps, corrector_hidden=h.corrector.hidden,
      corrector_lr=float(h.corrector.learning_rate), corrector_capacity=h.corrector.history,
      accuracy_window=h.accuracy_window, history_size=h.history_size)


def init_hybrid_state(ctx: HybridContext, params: Any, rng: jax.Array) -> HybridState:
  """A fresh state around `params` (the optimizer is initialised here)."""
  rng, dyn_rng, corr_rng = jax.random.split(rng, 3)
  g, f = ctx.groups.n_groups, ctx.groups.feature_dim
  return HybridState(
      train=init_train_state(params, ctx.tx),
      velocity=jax.tree.map(jnp.zeros_like, params),
      dynamics=dynamics_lib.init_dynamics(dyn_rng, ctx.rssm),
      corrector=corrector_lib.init_corrector(corr_rng, f, ctx.corrector_capacity,
                                             ctx.corrector_hidden, ctx.corrector_lr),
      history=state_lib.init_history(ctx.history_size, f, g),
      controller=state_lib.init_controller(max_predict_steps=ctx.hmax, n_groups=g, feature_dim=f,
                                           accuracy_window=ctx.accuracy_window),
      rng=rng)


# --- helpers -------------------------------------------------------------------------------------

def history_window(history: state_lib.History, window: int) -> dict[str, jax.Array]:
  """The last `window` entries, oldest first, normalised, with a validity mask."""
  n = history.features.shape[0]
  idx = (history.pos - window + jnp.arange(window)) % n
  valid = jnp.arange(window) >= window - jnp.minimum(history.count, window)
  x = features_lib.normalize(history.normalizer, history.features[idx])
  return {"x": jnp.where(valid[:, None], x, 0.0), "logloss": history.logloss[idx],
          "alpha_target": history.alpha_target[idx], "valid": valid}


def _info(*, loss, predicted_loss, grad_norm, was_real, finite, explosion, spike, validated, diverged,
          nonfinite_prediction, rollback_alpha, alpha) -> dict[str, jax.Array]:
  """The per-step facts every branch returns (identical structure across branches)."""
  f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
  b = lambda v: jnp.asarray(v, bool)  # noqa: E731
  return {"loss": f32(loss), "predicted_loss": f32(predicted_loss), "grad_norm": f32(grad_norm),
          "was_real": b(was_real), "finite": b(finite), "explosion": b(explosion),
          "spike": b(spike), "validated": b(validated), "diverged": b(diverged),
          "nonfinite_prediction": b(nonfinite_prediction),
          "rollback_alpha": jnp.asarray(rollback_alpha, jnp.float32),
          "alpha": jnp.asarray(alpha, jnp.float32)}


# --- the three step kinds ------------------------------------------------------------------------

def real_step(ctx: HybridContext, state: HybridState, batch: Mapping[str, Any]
              ) -> tuple[HybridState, dict[str, jax.Array]]:
  """A real gradient step plus the trajectory bookkeeping. A non-finite update is never applied."""
  tr, c, v, groups = state.train, state.controller, state.velocity, ctx.groups
  loss, grads = loss_and_grads(ctx.loss_fn, tr.params, batch, ctx.grad_accum)
  loss = loss.astype(jnp.float32)
  grad_norm = global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  params, opt_state, updates = guarded_update(ctx.tx, grads, tr.opt_state, tr.params, tr.step,
                                              finite)

  # Per-group statistics of this update against the velocity it is about to update.
  grad_sq = features_lib.group_sq_norms(groups, grads)
  update_sq = features_lib.group_sq_norms(groups, updates)
  uv = features_lib.group_dots(groups, updates, v)
  v_sq = features_lib.group_sq_norms(groups, v)
  param_sq = features_lib.group_sq_norms(groups, params)
  beta = ctx.velocity_beta
  velocity = jax.tree.map(lambda vv, u: jnp.where(finite, beta * vv + (1.0 - beta) * u.astype(vv.dtype), vv),
                          v, updates)

  # Controller statistics and health checks.
  logloss = features_lib.safe_log(loss)
  c, explosion, spike = controller_lib.update_real_stats(c, logloss, grad_norm, finite, ctx.control)
  # How well did the last one-step prediction do?
  c = controller_lib.push_error(c, controller_lib.relative_error(logloss, c.one_step_pred),
                                finite & c.prev_was_real & (state.history.count > 0))

  # History: the alpha target of the previous entry is the least-squares scale of this update
  # along the velocity that preceded it.
  h = state.history
  n = h.features.shape[0]
  prev = (h.pos - 1) % n
  alpha_star = jnp.clip(uv / jnp.maximum(v_sq, 1e-30), -ctx.rssm.alpha_max, ctx.rssm.alpha_max)
  write_target = finite & c.prev_was_real & (h.count > 0) & jnp.all(v_sq > 0)
  alpha_target = jnp.where(write_target, h.alpha_target.at[prev].set(alpha_star), h.alpha_target)
  lr = current_learning_rate(opt_state)
  x = features_lib.feature_vector(
      loss=loss, ema_fast=c.ema_fast, ema_slow=c.ema_slow, grad_norm=grad_norm, lr=lr,
      progress=tr.step.astype(jnp.float32) / ctx.total_steps, phase=c.phase, grad_sq=grad_sq,
      update_sq=update_sq, param_sq=param_sq, update_velocity_dot=uv, velocity_sq=v_sq)
  normalizer = features_lib.update_normalizer(h.normalizer, x, max_count=float(ctx.history_size * 4))
  h = h.replace(
      features=jnp.where(finite, h.features.at[h.pos].set(x), h.features),
      logloss=jnp.where(finite, h.logloss.at[h.pos].set(logloss), h.logloss),
      alpha_target=alpha_target.at[h.pos].set(jnp.where(finite, 0.0, alpha_target[h.pos])),
      normalizer=tree_where(finite, normalizer, h.normalizer),
      pos=jnp.where(finite, (h.pos + 1) % n, h.pos),
      count=jnp.where(finite, jnp.minimum(h.count + 1, n), h.count))

  # Dynamics model: one training step on the window, then imagine the next PREDICT plan.
  rng, train_rng, imagine_rng = jax.random.split(state.rng, 3)
  window = history_window(h, ctx.window)
  dyn, _ = dynamics_lib.train_step(state.dynamics, window, train_rng, ctx.rssm)
  imagined = dynamics_lib.imagine(dyn, window, ctx.hmax, imagine_rng, ctx.rssm)
  # Re-anchor the imagined curve on the smoothed loss: one batch's loss is too noisy a start.
  ens_logloss = imagined["logloss"] - logloss + c.ema_fast
  raw_logloss = jnp.mean(ens_logloss, axis=0)
  raw_alpha = jnp.mean(imagined["alpha"], axis=0)
  x_now = features_lib.normalize(normalizer, x)
  pos = (jnp.arange(ctx.hmax, dtype=jnp.float32) + 1.0) / ctx.hmax
  delta, log_scale = corrector_lib.apply_corrector(state.corrector, x_now, pos, ctx.corrector_hidden)
  if ctx.constant_alpha > 0:  # the ablation: velocity extrapolation without the RSSM's alphas
    plan_alpha = jnp.full_like(raw_alpha, ctx.constant_alpha)
    log_scale = jnp.zeros_like(log_scale)
  else:
    plan_alpha = raw_alpha * jnp.exp(log_scale)[:, None]
  agree = controller_lib.agreement(ens_logloss, ctx.control.divergence_tolerance)
  acc = controller_lib.accuracy(c, ctx.control.divergence_tolerance)

  # A real step inside PREDICT (a micro-correction) commits the segment so far and restarts the plan.
  in_predict = c.phase == state_lib.PREDICT
  rollback = jnp.where(in_predict & ~finite, c.alpha_since_good, 0.0)
  keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
  c = c.replace(
      plan_logloss=keep(raw_logloss + delta, c.plan_logloss), plan_raw_logloss=keep(raw_logloss, c.plan_raw_logloss),
      plan_alpha=keep(plan_alpha, c.plan_alpha), plan_log_scale=keep(log_scale, c.plan_log_scale),
      plan_x=keep(x_now, c.plan_x),
      plan_offset=jnp.where(in_predict, c.steps_in_phase + 1, c.plan_offset).astype(jnp.int32),
      alpha_since_good=jnp.where(in_predict & finite, 0.0, c.alpha_since_good),
      one_step_pred=keep(jnp.mean(imagined["next_logloss"]), c.one_step_pred),
      agreement=keep(agree, c.agreement), accuracy=keep(acc, c.accuracy),
      confidence=keep(agree * acc, c.confidence),
      velocity_norm=keep(jnp.sqrt(features_lib.group_sq_norms(groups, velocity)), c.velocity_norm))
  dyn = tree_where(finite, dyn, state.dynamics)

  new_state = state.replace(
      train=next_train_state(tr, params, opt_state, finite),
      velocity=velocity, dynamics=dyn, history=h, controller=c, rng=rng)
  info = _info(loss=loss, predicted_loss=jnp.exp(c.plan_logloss[0]), grad_norm=grad_norm,
               was_real=True, finite=finite, explosion=explosion, spike=spike, validated=False,
               diverged=False, nonfinite_prediction=False, rollback_alpha=rollback,
               alpha=jnp.zeros_like(rollback))
  return new_state, info


def predict_step(ctx: HybridContext, state: HybridState, batch: Mapping[str, Any]
                 ) -> tuple[HybridState, dict[str, jax.Array]]:
  """A predicted step: every parameter moves by alpha_{g,k} * velocity_g; no backward pass."""
  tr, c, groups = state.train, state.controller, ctx.groups
  k = jnp.clip(c.steps_in_phase - c.plan_offset, 0, ctx.hmax - 1)
  alpha = c.plan_alpha[k]
  # A non-finite plan (a diverged dynamics model) never moves the params: it ends the phase as a
  # non-finite prediction instead, and the segment so far is rolled back.
  bad_plan = ~jnp.all(jnp.isfinite(alpha))
  alpha = jnp.where(bad_plan, 0.0, alpha)
  params = features_lib.add_scaled_by_group(groups, tr.params, alpha, state.velocity)
  since_good = c.alpha_since_good + alpha

  validate = (((k + 1) % ctx.control.validate_every) == 0) | (c.steps_in_phase + 1 >= c.horizon)
  loss = jax.lax.cond(validate,
                      lambda p: ctx.loss_fn(p, batch)[0].astype(jnp.float32),
                      lambda p: jnp.ones((), jnp.float32), params)
  logloss = features_lib.safe_log(loss)
  predicted = c.plan_logloss[k]
  finite = jnp.isfinite(logloss)
  tol = jnp.log1p(ctx.control.divergence_tolerance)
  nonfinite_prediction = (validate & ~finite) | bad_plan
  diverged = (validate & finite & ~bad_plan &
              ((logloss > predicted + tol) | (logloss > c.start_logloss + tol)))
  good = validate & finite & ~diverged & ~bad_plan
  rollback = jnp.where(diverged | nonfinite_prediction, since_good, 0.0)
  c = controller_lib.push_error(c, controller_lib.relative_error(logloss, predicted), validate & finite)

  # The corrector learns from every validation: the residual of the dynamics model's log-loss and
  # the alpha scale that would have matched the realised improvement.
  observed = validate & finite
  realised_gain = c.start_logloss - logloss
  predicted_gain = c.start_logloss - predicted
  target_log_scale = c.plan_log_scale[k] + jnp.clip(
      jnp.log(jnp.maximum(realised_gain, 1e-3) / jnp.maximum(predicted_gain, 1e-3)), -1.5, 0.5)
  corr = corrector_lib.add_residual(
      state.corrector, c.plan_x, (k + 1).astype(jnp.float32) / ctx.hmax,
      logloss - c.plan_raw_logloss[k], target_log_scale, observed)
  corr, _ = corrector_lib.train_corrector(corr, ctx.corrector_hidden, ctx.corrector_lr, observed)

  acc = controller_lib.accuracy(c, ctx.control.divergence_tolerance)
  c = c.replace(alpha_since_good=jnp.where(good, 0.0, since_good), accuracy=acc,
                confidence=c.agreement * acc)
  new_state = state.replace(train=tr.replace(params=params, step=tr.step + 1), corrector=corr,
                            controller=c)
  info = _info(loss=jnp.where(validate, loss, jnp.exp(predicted)), predicted_loss=jnp.exp(predicted),
               grad_norm=0.0, was_real=False, finite=True, explosion=False, spike=False,
               validated=validate, diverged=diverged, nonfinite_prediction=nonfinite_prediction,
               rollback_alpha=rollback, alpha=alpha)
  return new_state, info


def rollback_params(ctx: HybridContext, params: Any, velocity: Any, alpha_sum: jax.Array) -> Any:
  """theta - sum_g A_g velocity_g: undoes predicted steps whose alphas sum to `alpha_sum`, exactly
  up to float rounding, with no snapshot of the params."""
  return features_lib.add_scaled_by_group(ctx.groups, params, -alpha_sum, velocity)


def correct_entry_step(ctx: HybridContext, state: HybridState, batch: Mapping[str, Any]
                       ) -> tuple[HybridState, dict[str, jax.Array]]:
  """First CORRECT step: roll back what diverged, train the corrector, then a real step."""
  c = state.controller
  params = rollback_params(ctx, state.train.params, state.velocity, c.rollback_alpha)
  has_data = jnp.any(state.corrector.valid)
  corr, _ = corrector_lib.train_corrector(state.corrector, ctx.corrector_hidden, ctx.corrector_lr,
                                          has_data)
  state = state.replace(train=state.train.replace(params=params), corrector=corr,
                        controller=c.replace(rollback_alpha=jnp.zeros_like(c.rollback_alpha)))
  return real_step(ctx, state, batch)


BRANCHES = (real_step, predict_step, correct_entry_step)


def finish_step(ctx: HybridContext, state: HybridState, info: Mapping[str, jax.Array],
                phase_before: jax.Array) -> tuple[HybridState, dict[str, jax.Array]]:
  """Applies the controller transition and assembles the small metrics dict."""
  c = controller_lib.transition(
      state.controller, was_real=info["was_real"], finite=info["finite"],
      explosion=info["explosion"], spike=info["spike"], validated=info["validated"],
      diverged=info["diverged"], nonfinite_prediction=info["nonfinite_prediction"],
      rollback_alpha=info["rollback_alpha"], s=ctx.control)
  metrics = {"loss": info["loss"], "predicted_loss": info["predicted_loss"],
             "phase": phase_before, "confidence": c.confidence, "grad_norm": info["grad_norm"],
             "step": state.train.step, "horizon": c.horizon,
             "measured": info["was_real"] | info["validated"],
             "diverged": info["diverged"] | info["nonfinite_prediction"],
             # Per-group vectors (G,): the alpha this step applied (0 in real steps), velocity norms.
             "alpha": info["alpha"], "velocity_norm": c.velocity_norm}
  return state.replace(controller=c), metrics


def make_phase_step(ctx: HybridContext, branch: int) -> Callable:
  """One step kind plus the transition, as a pure function (jit it with donate_argnums=0)."""
  fn = BRANCHES[branch]

  def step(state: HybridState, batch):
    phase = state.controller.phase
    new_state, info = fn(ctx, state, batch)
    return finish_step(ctx, new_state, info, phase)
  return step


def hybrid_step(ctx: HybridContext, state: HybridState, batch: Mapping[str, Any]
                ) -> tuple[HybridState, dict[str, jax.Array]]:
  """One hybrid step: `lax.switch` on the on-device branch, then the controller transition."""
  phase = state.controller.phase
  branches = [lambda s, b, f=f: f(ctx, s, b) for f in BRANCHES]
  new_state, info = jax.lax.switch(state.controller.next_branch, branches, state, batch)
  return finish_step(ctx, new_state, info, phase)


def hybrid_multi_step(ctx: HybridContext, state: HybridState, batches: Mapping[str, Any]
                      ) -> tuple[HybridState, dict[str, jax.Array]]:
  """K hybrid steps in one dispatch (`lax.scan`); `batches` has a leading axis K."""
  return jax.lax.scan(lambda s, b: hybrid_step(ctx, s, b), state, batches)


# --- host driver ---------------------------------------------------------------------------------

class HybridDriver:
  """Runs hybrid training from the host loop in `hybridjax.trainer`.

  With `dispatch='host'` each step reads the on-device `next_branch` (one scalar) and calls that
  branch's own jitted, donating function; this also gives exact per-phase timings. With
  `dispatch='switch'` it calls the fused `hybrid_step` and never waits on the device.
  """

  def __init__(self, config: ml_collections.ConfigDict, *, loss_fn: LossFn,
               tx: optax.GradientTransformation, rng: jax.Array, init_params: Callable[[], Any],
               mesh: jax.sharding.Mesh | None = None):
    """`mesh` (from `sharding.make_mesh`): the state is created and kept sharded on it, and every
    step is jitted with matching in/out shardings. None or one device: plain single-device jit."""
    self.config = config
    self._init_params = init_params
    self._rng = rng
    params_shape = jax.eval_shape(init_params)
    self.ctx = make_context(config.hybrid, loss_fn=loss_fn, tx=tx, params_shape=params_shape,
                            total_steps=config.trainer.steps, grad_accum=config.trainer.grad_accum)
    self.dispatch = config.hybrid.dispatch
    self.mesh = mesh if sharding_lib.is_multi_device(mesh) else None
    self.state_shardings = None  # a tree like HybridState, on a multi-device mesh
    if self.mesh is not None:
      self.state_shardings = sharding_lib.hybrid_state_shardings(
          jax.eval_shape(self._init_state_unsharded), self.mesh)
    jit_kw = sharding_lib.step_jit_kwargs(self.state_shardings, self.mesh)
    self._phase_fns = [jax.jit(make_phase_step(self.ctx, b), donate_argnums=0, keep_unused=True,
                               **jit_kw)
                       for b in range(state_lib.N_BRANCHES)]
    self._fused = jax.jit(lambda s, b: hybrid_step(self.ctx, s, b), donate_argnums=0,
                          keep_unused=True, **jit_kw)
    self.phase_seconds = np.zeros(4)
    self.phase_timed_steps = np.zeros(4, np.int64)
    self._pending: tuple[int, float] | None = None
    self._compiled = False
    self._last_phase: int | None = None
    self.memory_events: list[dict[str, Any]] = []  # readings at phase transitions, for the log
    # Per-step metrics: device references until `flush_trace` fetches them all in one transfer at a
    # log step, so the trace adds no per-step host synchronisation.
    self._trace_device: list[dict[str, jax.Array]] = []
    self.trace: list[dict[str, Any]] = []

  def _init_state_unsharded(self) -> HybridState:
    # The params are made as the baseline makes them (eagerly, so both start bit-identical); the
    # rest in one jitted call instead of ~200 small eager dispatches and compiles.
    params = self._init_params()
    return jax.jit(lambda p, r: init_hybrid_state(self.ctx, p, r))(params, self._rng)

  def init_state(self) -> HybridState:
    """A fresh state; on a multi-device mesh laid out with `state_shardings`.

    The params are created directly sharded (never whole on one device); the optimizer state and
    velocity are made from them and keep their sharding. The small replicated rest (RSSM,
    corrector, history, controller) is built as on one device, then copied to every device: the
    same values as a one-device run, and no compile of the RSSM's initialisation per mesh.
    """
    if self.mesh is None:
      return self._init_state_unsharded()
    sh = self.state_shardings
    params = sharding_lib.sharded_init(self._init_params, sh.train.params)()
    return jax.device_put(init_hybrid_state(self.ctx, params, self._rng), sh)

  def compile(self, state: HybridState, batch: Mapping[str, Any]) -> None:
    """Compiles every step kind ahead of time, so no compile lands inside a timed phase."""
    if self.dispatch == "switch":
      self._fused = self._fused.lower(state, batch).compile()
    else:
      self._phase_fns = [f.lower(state, batch).compile() for f in self._phase_fns]
    self._compiled = True

  def step(self, state: HybridState, batch: Mapping[str, Any]) -> tuple[HybridState, dict]:
    if not self._compiled:
      self.compile(state, batch)
    if self.dispatch == "switch":
      state, metrics = self._fused(state, batch)
      self._trace_device.append(metrics)
      return state, metrics
    # Reading the branch waits for the previous step: the time since its dispatch is its cost.
    # Python ints at once: on CPU, device_get returns zero-copy views of the device buffers, and a
    # live view keeps XLA from donating them (they would be copied, and the old leaves kept).
    branch, phase, step = (int(v) for v in jax.device_get(
        (state.controller.next_branch, state.controller.phase, state.train.step)))
    now = time.perf_counter()
    if self._last_phase is not None and int(phase) != self._last_phase:
      # Memory at every phase transition (DESIGN.md section 3). The pending per-step metrics are
      # fetched first (the device is idle here anyway), so every reading sees the same arrays.
      self.flush_trace()
      snap = memory_lib.memory_snapshot()
      snap.update(step=int(step), phase_from=PHASE_NAMES[self._last_phase],
                  phase_to=PHASE_NAMES[int(phase)])
      self.memory_events.append(snap)
    self._last_phase = int(phase)
    if self._pending is not None:
      p, t0 = self._pending
      self.phase_seconds[p] += now - t0
      self.phase_timed_steps[p] += 1
    self._pending = (int(phase), now)
    state, metrics = self._phase_fns[int(branch)](state, batch)
    self._trace_device.append(metrics)
    return state, metrics

  def flush_trace(self) -> None:
    """Fetches the per-step metrics held since the last flush into host records (`self.trace`)."""
    if not self._trace_device:
      return
    host = jax.device_get(self._trace_device)
    self._trace_device = []
    for m in host:
      rec = {"step": int(m["step"]), "phase": int(m["phase"]), "loss": float(m["loss"]),
             "predicted_loss": float(m["predicted_loss"]), "confidence": float(m["confidence"]),
             "horizon": int(m["horizon"]), "measured": bool(m["measured"]),
             "diverged": bool(m["diverged"])}
      if rec["phase"] == state_lib.PREDICT:
        rec["alpha"] = [round(float(a), 5) for a in m["alpha"]]
      self.trace.append(rec)

  def pop_trace(self) -> list[dict[str, Any]]:
    """Per-step records (step, phase, loss, predicted_loss, confidence, horizon, measured,
    diverged, and alpha per group in predicted steps) since the last call."""
    self.flush_trace()
    trace, self.trace = self.trace, []
    return trace

  def pop_memory_events(self) -> list[dict[str, Any]]:
    """Memory readings taken at phase transitions since the last call."""
    events, self.memory_events = self.memory_events, []
    return events

  def pause_timing(self) -> None:
    """Called by the trainer before eval/checkpoint work, which is not a step's cost."""
    self._pending = None

  def log_fields(self, state: HybridState) -> dict[str, float]:
    c = jax.device_get(state.controller)
    total = max(int(c.phase_steps.sum()), 1)
    return {"phase_now": int(c.phase), "predict_fraction": float(c.phase_steps[2]) / total,
            "backward_passes": int(c.backward_passes), "confidence_now": float(c.confidence),
            "accuracy": float(c.accuracy), "agreement": float(c.agreement),
            "health_events": int(c.events.sum()), "nonfinite_events": int(c.events[0]),
            "rollbacks": int(c.rollbacks)}

  @staticmethod
  def progress_fields(record: Mapping[str, Any]) -> dict[str, str]:
    """Progress-bar fields from a log record made with `log_fields` (no second device read)."""
    return {"phase": PHASE_NAMES[int(record["phase_now"])], "pred": f"{record['predict_fraction']:.0%}",
            "conf": f"{record['confidence_now']:.2f}"}

  def summary(self, state: HybridState) -> dict[str, Any]:
    c = jax.device_get(state.controller)
    steps = int(c.phase_steps.sum())
    out = {
        "phase_steps": {n: int(v) for n, v in zip(PHASE_NAMES, c.phase_steps)},
        "backward_passes": int(c.backward_passes),
        "backward_passes_saved": steps - int(c.backward_passes),
        "validation_forwards": int(c.forward_passes),
        "predict_fraction": float(c.phase_steps[2]) / max(steps, 1),
        "predict_phases": int(c.predict_phases),
        "rollbacks": int(c.rollbacks),
        "health_events": {n: int(v) for n, v in zip(state_lib.EVENT_NAMES, c.events)},
        "group_names": list(self.ctx.groups.names),  # the order of the per-group vectors in logs
    }
    if self.dispatch == "host" and self.phase_timed_steps.sum() > 0:
      out["phase_seconds"] = {n: round(float(s), 3) for n, s in zip(PHASE_NAMES, self.phase_seconds)}
      out["phase_ms_per_step"] = {
          n: round(1e3 * float(s) / int(k), 2) for n, s, k in
          zip(PHASE_NAMES, self.phase_seconds, self.phase_timed_steps) if k > 0}
    return out
