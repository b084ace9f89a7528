"""The jump predictor (`hybrid.method='jump'`): long moves along the drift of the averaged iterate.

A jump of k steps stands in for k real steps (docs/design.md, "Jumps"):

  r      = (EMA_fast - EMA_slow) / (lag_slow - lag_fast)          the drift per step
  theta <- theta + sum_g s_g s k r_g, EMA_fast, EMA_slow likewise   (the same translation)
  step  <- step + k                                                (the schedule; no batch is used)

EMA_fast is the train state's averaging EMA (`trainer.averaging='ema'`), EMA_slow the hybrid
state's `drift_memory`; lag is the mean age of an EMA's (bias-corrected) weights. Translating both
EMAs by the move keeps r as it was and puts the averaged model where the move puts the params.
With outer momentum (`optim.outer_every` > 0) the drift is m (1 - mu) / K instead, and outer
momentum's slow params move with the jump (no slow EMA is kept: two params-sized buffers, m and slow).

s_g is the per-group scale (`JumpTracker.group_scale`, 1), s the candidate's move scale.

At a PREDICT step (`jump_step`) the candidates (k, s) in `hybrid.jump.horizons` x `hybrid.jump.scales`
are scored one at a time
(`lax.scan`, so one moved copy of the params exists at a time) by the loss on the probe batch: the
next batch of the training stream, which the following real step then trains on. The best one is
accepted when its probe loss is below (1 - margin) x the loss without a jump and, with
`trend_credit` c > 0, below that loss lowered by c x the progress k real steps are expected to make
(the loss trend before the jump); a rejected attempt
leaves the train state exactly as it was. The CORRECT phase of real steps follows either way, and
measures the accepted jump's persisting gain.

The skip control (`hybrid.jump.skip_control`) runs the same decisions but an accepted jump only
advances the schedule: what skipping schedule steps alone buys.

Real steps (`full_step`) are the baseline's step plus the slow EMA and the controller's loss
statistics: no dynamics training, no history (1.12x a baseline step on the `long` benchmark's
0.12M-param model, where the slow EMA's pass over the params and the controller's scalar
statistics are not hidden).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.phases import Phase
from hybridjax.hybrid.real_step import real_update
from hybridjax.hybrid.state import Controller, HybridState
from hybridjax.methods.jump import forecast as forecast_lib
from hybridjax.optim import (
  Averaging,
  Batch,
  Schedule,
  next_train_state,
  tree_where,
  update_average,
)


@dataclasses.dataclass(frozen=True)
class JumpSettings:
  """The jump predictor's static knobs (`hybrid.jump`, docs/design.md "Jumps")."""

  horizons: tuple[int, ...]  # candidate k, scored one at a time on the probe batch
  scales: tuple[float, ...]  # candidate move scales s: a candidate moves s k r and advances k
  margin: float  # accept only if the probe loss falls below (1 - margin) x the no-jump loss
  trend_credit: float  # ... and below it by this fraction of the progress k real steps would make
  slow_beta: float  # the slow EMA of the params; the fast one is the averaging EMA
  slow_lag_ratio: float  # > 0: the slow EMA's beta from the averaging beta, 1 - (1 - beta) / ratio
  start_fraction: float  # no jump before this fraction of the schedule
  stop_fraction: float  # no jump may end past this fraction of the schedule
  skip_control: bool  # True: an accepted jump advances the schedule by k and moves no weight
  # The RSSM forecaster of s_g and the expected gain (`hybrid.jump.forecast='rssm'`), or None.
  forecast: forecast_lib.ForecastSettings | None = None


@flax.struct.dataclass
class JumpTracker:
  """The jump predictor's counters and the persisting-gain measurement, on the device."""

  jump_attempts: jax.Array  # int32: PREDICT steps that scored candidates
  jumps: jax.Array  # int32: accepted jumps
  jump_steps: jax.Array  # int32: schedule steps advanced by accepted jumps (sum of k)
  last_jump_k: jax.Array  # int32: k of the last attempt (0 = rejected)
  last_jump_scale: jax.Array  # the move scale s of the last attempt's candidate (0 = rejected)
  last_probe_gain: jax.Array  # relative probe-loss drop of the last attempt's best candidate
  group_scale: jax.Array  # (G,) s_g: a jump moves group g by s_g * k * r_g
  # Persisting gain of the last accepted jump, measured over the CORRECT phase after it: the mean
  # of (expected - measured) log-loss of its real steps, expected from the loss trend before it.
  persist_tracking: jax.Array  # bool: a CORRECT phase after an accepted jump is being measured
  persist_level: jax.Array  # log-loss level at the jump
  persist_trend: jax.Array  # log-loss change per real step before the jump
  persist_sum: jax.Array
  persist_n: jax.Array  # int32
  last_persisting_gain: jax.Array
  persisting_gain_sum: jax.Array  # over all measured jumps
  persisting_gain_count: jax.Array  # int32


@flax.struct.dataclass
class JumpState:
  """The jump predictor's own state (`HybridState.method` with `hybrid.method='jump'`)."""

  # The slow EMA of the params (an `optim.Averaging`), or None when outer momentum's m gives the drift.
  drift_memory: Any
  forecast: Any  # the RSSM forecaster (`forecast.Forecast`) with `hybrid.jump.forecast='rssm'`, else None
  tracker: JumpTracker


def init_tracker(n_groups: int) -> JumpTracker:
  """No jump yet; every group's scale 1."""
  counts = ("jump_attempts", "jumps", "jump_steps", "last_jump_k", "persist_n", "persisting_gain_count")  # int32
  reals = (
    "last_jump_scale", "last_probe_gain", "persist_level", "persist_trend", "persist_sum",
    "last_persisting_gain", "persisting_gain_sum",
  )  # fmt: skip
  return JumpTracker(
    **{name: jnp.asarray(0, jnp.int32) for name in counts},
    **{name: jnp.asarray(0.0, jnp.float32) for name in reals},
    group_scale=jnp.ones((n_groups,), jnp.float32),
    persist_tracking=jnp.asarray(False),
  )


# Lags of the controller's two log-loss EMAs (`controller.update_real_stats`).
_LOSS_LAG_FAST = controller_lib.LOSS_BETA_FAST / (1 - controller_lib.LOSS_BETA_FAST)
_LOSS_LAG_SLOW = controller_lib.LOSS_BETA_SLOW / (1 - controller_lib.LOSS_BETA_SLOW)


def ema_lag(beta: jax.Array | float, count: jax.Array | int) -> jax.Array:
  """Mean age (in steps) of a bias-corrected EMA's weights after `count` >= 1 steps:
  beta/(1-beta) - n beta^n / (1 - beta^n); 0 at n = 1, beta/(1-beta) for a long run."""
  beta = jnp.asarray(beta, jnp.float32)
  n = jnp.maximum(jnp.asarray(count, jnp.float32), 1.0)
  bn = beta**n
  return beta / (1.0 - beta) - n * bn / (1.0 - bn)


def init_drift_memory(params: Any, slow_beta: float) -> Averaging:
  """The slow EMA, starting at `params` (bias-corrected like the averaging EMA)."""
  return Averaging(
    params=jax.tree.map(lambda p: jnp.array(p, jnp.float32, copy=True), params),
    beta=jnp.asarray(float(slow_beta), jnp.float32),
  )


def drift_per_step(fast: Averaging, slow: Averaging, count: jax.Array) -> Any:
  """r = (fast - slow) / (lag_slow - lag_fast) after `count` steps: for params moving at a
  constant velocity v, r = v. Zero while the lags are equal (count 1)."""
  gap = ema_lag(slow.beta, count) - ema_lag(fast.beta, count)
  scale = jnp.where(gap > 1e-6, 1.0 / jnp.maximum(gap, 1e-6), 0.0)
  return jax.tree.map(lambda f, s: (f - s) * scale, fast.params, slow.params)


def jump_drift(state: HybridState) -> Any:
  """The drift the jump follows: from the averaging EMA and the slow EMA, or when the train state has
  outer momentum from its m, m (1 - mu) / K (in a steady state m is d / (1 - mu), d the K-step
  displacement), so that a jump combined with it needs no slow EMA."""
  tr, outer = state.train, state.train.outer
  if outer is None:
    return drift_per_step(tr.averaging, state.method.drift_memory, tr.step)
  scale = (1.0 - outer.mu) / outer.every.astype(jnp.float32)
  return jax.tree.map(lambda m: m * scale, outer.momentum)


def window_bounds(start_fraction: float, stop_fraction: float, total_steps: int) -> tuple[int, int]:
  """The schedule steps a jump may start at or after and must end by: `start_fraction` and
  `stop_fraction` of a run of `total_steps`, rounded."""
  return int(round(start_fraction * total_steps)), int(round(stop_fraction * total_steps))


def in_jump_window(ctx: HybridContext, step: jax.Array) -> jax.Array:
  """True when a jump of the longest horizon from schedule step `step` starts after
  `start_fraction` and ends before `stop_fraction` of the run (`window_bounds`)."""
  j = ctx.settings
  start, stop = window_bounds(j.start_fraction, j.stop_fraction, ctx.total_steps)
  return (step >= start) & (step + max(j.horizons) <= stop)


def score_candidates(
  ctx: HybridContext, params: Any, drift: Any, amounts: jax.Array, batch: Batch
) -> tuple[jax.Array, jax.Array]:
  """(probe loss without a jump, probe loss of each candidate), float32; candidate c moves group g
  by amounts[c, g] r_g.

  A `lax.scan` over the candidates: each candidate's params are formed, scored and dropped before
  the next, so scoring needs one params-sized buffer whatever the number of candidates.
  """
  base = ctx.loss_fn(params, batch)[0].astype(jnp.float32)

  def score(carry, amount):
    moved = groups_lib.add_scaled_by_group(ctx.groups, params, amount, drift)
    return carry, ctx.loss_fn(moved, batch)[0].astype(jnp.float32)

  return base, jax.lax.scan(score, None, amounts)[1]


def translate_averaging(averaging: Averaging | None, groups: Any, amount: jax.Array, drift: Any) -> Averaging | None:
  """The average moved by sum_g amount_g r_g (None stays None)."""
  if averaging is None:
    return None
  return averaging.replace(params=groups_lib.add_scaled_by_group(groups, averaging.params, amount, drift))


def jump_step(ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule) -> tuple[HybridState, StepInfo]:
  """The PREDICT step of the jump predictor: score, then jump k steps or leave everything as it was.

  `batch` is the probe batch (the next batch of the training stream); it is not consumed.
  """
  del schedule
  tr, c, j = state.train, state.controller, ctx.settings
  m: JumpState = state.method
  t = m.tracker
  drift = jump_drift(state)
  # The candidates (k, s): each horizon in `hybrid.jump.horizons` at each move scale in
  # `hybrid.jump.scales` (a candidate moves s k r and advances the schedule by k).
  ks = tuple(k for k in j.horizons for _ in j.scales)
  horizons, scales = jnp.asarray(ks, jnp.int32), jnp.asarray(j.scales * len(j.horizons), jnp.float32)
  forecast = m.forecast
  if forecast is not None:
    # The RSSM's s_g for each candidate, its expected persisting gain and the ensemble's agreement
    # on it: a candidate is admitted when the gain is positive and the members agree.
    group_scales, expected, agreement = forecast_lib.forecast_moves(
      j.forecast, forecast, ks, jax.random.fold_in(state.rng, t.jump_attempts)
    )
    admitted = (expected > 0) & (agreement >= j.forecast.min_agreement)
  else:
    group_scales = jnp.ones(horizons.shape + t.group_scale.shape, jnp.float32)
    admitted = jnp.ones(horizons.shape, bool)
  # Candidate c moves group g by s_g(c) s_c k_c r_g (times the controller's s_g, 1).
  amounts = t.group_scale[None, :] * group_scales * (scales * horizons.astype(jnp.float32))[:, None]
  base, losses = score_candidates(ctx, tr.params, drift, amounts, batch)
  # The log-loss trend per real step before the jump (from the controller's two loss EMAs). A
  # candidate of k steps must beat the no-jump loss by `trend_credit` x the progress k real steps
  # are expected to make (with trend_credit 0, by nothing: the best probe loss wins).
  trend = (c.ema_fast - c.ema_slow) / (_LOSS_LAG_SLOW - _LOSS_LAG_FAST)
  expected_trend = j.trend_credit * horizons.astype(jnp.float32) * jnp.minimum(trend, 0.0)
  excess = groups_lib.safe_log(losses) - groups_lib.safe_log(base) - expected_trend
  best = jnp.argmin(jnp.where(jnp.isfinite(excess) & admitted, excess, jnp.inf))
  best_loss = losses[best]
  # Accepted when L_k < (1 - margin) L_0 exp(trend_credit k trend): in log-loss, excess < log(1 - margin).
  accept = (
    jnp.isfinite(base)
    & jnp.isfinite(best_loss)
    & admitted[best]
    & (excess[best] < jnp.log1p(-j.margin))
    & in_jump_window(ctx, tr.step)
  )
  k = jnp.where(accept, horizons[best], 0)
  # The move: amounts[best] on the params and both EMAs; none in the skip control or when rejected.
  amount = jnp.where(accept, amounts[best], 0.0) * (0.0 if j.skip_control else 1.0)
  moved = tr.replace(
    params=groups_lib.add_scaled_by_group(ctx.groups, tr.params, amount, drift),
    averaging=translate_averaging(tr.averaging, ctx.groups, amount, drift),
    step=tr.step + k,
  )
  if tr.outer is not None:  # the jump is no inner progress: outer momentum's anchor moves with it
    moved = moved.replace(
      outer=tr.outer.replace(slow=groups_lib.add_scaled_by_group(ctx.groups, tr.outer.slow, amount, drift))
    )
  # Rejected: the very same buffers' values (a select of the old ones), bit for bit. (No slow EMA stays None.)
  train, drift_memory = tree_where(
    accept, (moved, translate_averaging(m.drift_memory, ctx.groups, amount, drift)), (tr, m.drift_memory)
  )

  t = t.replace(
    jump_attempts=t.jump_attempts + 1,
    jumps=t.jumps + accept.astype(jnp.int32),
    jump_steps=t.jump_steps + k,
    last_jump_k=k,
    last_jump_scale=jnp.where(accept, scales[best], 0.0),
    last_probe_gain=jnp.where(jnp.isfinite(base), (base - best_loss) / base, 0.0),
    # The accepted jump's persisting gain is measured over the CORRECT phase that follows.
    persist_tracking=accept,
    persist_level=jnp.where(accept, c.ema_fast + trend * _LOSS_LAG_FAST, t.persist_level),
    persist_trend=jnp.where(accept, trend, t.persist_trend),
    persist_sum=jnp.where(accept, 0.0, t.persist_sum),
    persist_n=jnp.where(accept, 0, t.persist_n),
  )
  if forecast is not None:
    # An accepted jump's move leaves the interval's realised ratio; its expected gain is kept for
    # the calibration.
    recorded = forecast_lib.record_jump(ctx.groups, forecast, amount, drift, expected[best])
    forecast = forecast.replace(
      jump_dot=jnp.where(accept, recorded.jump_dot, forecast.jump_dot),
      expected_gain=jnp.where(accept, recorded.expected_gain, forecast.expected_gain),
      last_expected=expected[best],
      last_agreement=agreement[best],
      last_scale=group_scales[best],
    )
  return state.replace(
    train=train, method=m.replace(drift_memory=drift_memory, forecast=forecast, tracker=t)
  ), StepInfo.predicted(
    loss=jnp.where(accept, best_loss, base),  # the probe loss where the params now are
    predicted_loss=base,  # the probe loss without a jump
    validated=True,
    alpha=amount,
    forwards=1 + len(ks),
    batch_consumed=False,
  )


def track_persisting_gain(
  t: JumpTracker, c: Controller, logloss: jax.Array, finite: jax.Array, correct_steps: int
) -> JumpTracker:
  """Adds one CORRECT real step to the persisting gain of the jump before it, and closes the
  measurement at the phase's last step. Expected log-loss without the jump after i real steps:
  level + trend * i (the trend of the loss EMAs before the jump)."""
  measuring = t.persist_tracking & (c.phase == Phase.CORRECT)
  on = measuring & finite
  gain = t.persist_level + t.persist_trend * (t.persist_n + 1).astype(jnp.float32) - logloss  # i = persist_n + 1
  total = t.persist_sum + jnp.where(on, gain, 0.0)
  n = t.persist_n + on.astype(jnp.int32)
  done = measuring & (c.steps_in_phase + 1 >= correct_steps) & (n > 0)
  mean = total / jnp.maximum(n, 1).astype(jnp.float32)
  return t.replace(
    persist_sum=total,
    persist_n=n,
    persist_tracking=t.persist_tracking & ~done,
    last_persisting_gain=jnp.where(done, mean, t.last_persisting_gain),
    persisting_gain_sum=t.persisting_gain_sum + jnp.where(done, mean, 0.0),
    persisting_gain_count=t.persisting_gain_count + done.astype(jnp.int32),
  )


def full_step(ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule) -> tuple[HybridState, StepInfo]:
  """A real step of the jump predictor: the baseline's update (same function, same bits), the slow
  EMA, the controller's loss statistics and health checks, the persisting-gain measurement. The
  confidence is 1 inside the jump window and 0 outside, which is what lets the controller enter
  PREDICT; the margin on the probe loss is the gate on the jump itself."""
  tr = state.train
  loss, _, grad_norm, finite, lr, params, opt_state, _ = real_update(ctx, tr, batch, schedule)
  train = next_train_state(tr, params, opt_state, finite)
  m: JumpState = state.method
  drift_memory = update_average(m.drift_memory, train.params, train.step)

  logloss = groups_lib.safe_log(loss)
  # The loss statistics and health checks (no one-step loss prediction to score: jumps make none).
  c, explosion, spike = controller_lib.update_real_stats(state.controller, logloss, grad_norm, finite, ctx.control)
  t = track_persisting_gain(m.tracker, c, logloss, finite, ctx.control.correct_steps)
  c = c.replace(confidence=in_jump_window(ctx, train.step).astype(jnp.float32))
  forecast = m.forecast
  if forecast is not None:
    fs = ctx.settings.forecast
    # Calibrated when this step closed the last jump's measurement.
    forecast = forecast_lib.calibrate(
      forecast, t.last_persisting_gain, t.persisting_gain_count > m.tracker.persisting_gain_count
    )

    def take_snapshot(f):
      return forecast_lib.snapshot(
        fs,
        ctx.groups,
        f,
        fast=train.averaging.params,
        drift=drift_per_step(train.averaging, drift_memory, train.step),
        lr=lr,
        progress=train.step.astype(jnp.float32) / ctx.total_steps,
        loss_fast=c.ema_fast,
        loss_slow=c.ema_slow,
        rng=jax.random.fold_in(state.rng, c.real_count),
      )

    # Every `every` real steps (the dynamics model trains here, not at every step).
    forecast = forecast_lib.run_if(forecast_lib.takes_snapshot(fs, c.real_count, finite), take_snapshot, forecast)
  return state.replace(
    train=train, method=m.replace(drift_memory=drift_memory, forecast=forecast, tracker=t), controller=c
  ), StepInfo.real(
    loss=loss, grad_norm=grad_norm, finite=finite, explosion=explosion, spike=spike, n_groups=ctx.groups.n_groups
  )
