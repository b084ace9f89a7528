"""The RSSM as the jump's long-range forecaster (`hybrid.jump.forecast='rssm'`, docs/design.md "Forecast").

The jump predictor moves group g by s_g k r_g. With the forecaster on, s_g and the decision to jump
come from an ensemble of RSSMs (`dynamics.RSSM`, the same Flax module the velocity predictor uses)
that models the trajectory at the scale of snapshots, not of steps:

* every `every` = D real steps (a **snapshot**) it records one entry: the learning rate, the run's
  progress, the smoothed log-loss and its trend, and per group g the drift's norm log|r_g|, its
  cosine with the drift of the previous snapshot, and the realised ratio of the interval just ended;
* the **realised ratio** a_g of an interval [t, t + D] is how far the averaged iterate actually went
  along the drift measured at t, in units of that drift:

      a_g = <EMA_{t+D} - EMA_t - J_g, r_g(t)> / (D |r_g(t)|^2)

  (J_g: what accepted jumps inside the interval moved it; a_g = 1 when r_g forecast the interval's
  move along itself exactly). It is the least-squares scale of D r_g(t) for the interval's move: the
  target of the RSSM's per-group head, as the velocity predictor's alpha is of one update;
* the entry's log-loss change to the next is the target of the RSSM's loss head;
* at each snapshot the ensemble takes `train_steps` optimizer steps on the snapshot window, so the
  dynamics model trains at boundaries, not inside every real step.

At a jump attempt the ensemble imagines the next ceil(k_max / D) intervals. For a candidate of k steps:

    s_g(k)     = mean over members and the k / D intervals ahead of the predicted a_g, clipped to
                 [0, max_scale]                                      (where the trajectory goes)
    gain_e(k)  = - sum of member e's predicted log-loss changes over those intervals
    expected   = calibration x mean_e gain_e(k)                      (the expected persisting gain)
    agreement  = exp(- std_e gain_e(k) / |mean_e gain_e(k)|)

A candidate is admitted when its expected gain is positive and the agreement reaches
`min_agreement`; the probe batch then chooses among the admitted ones, as without the forecaster.
`calibration` (1 at the start) is an EMA of (realised persisting gain / expected gain) over the
accepted jumps, so the expected gain learns from what jumps actually realised.

Memory: one params-sized buffer (the drift at the last snapshot) beside the jump's slow EMA, which
is the second buffer the jump contract allows; the RSSM's parameters and optimizer state are
carried raveled into one vector (each donated leaf costs a real step its dispatch).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid import trajectory as trajectory_lib
from hybridjax.hybrid.trajectory import History, history_window, init_history
from hybridjax.models import rssm as dynamics_lib


@dataclasses.dataclass(frozen=True)
class ForecastSettings:
  """The forecaster's static knobs (`hybrid.jump.forecaster`, docs/design.md "Forecast")."""

  every: int  # D: real steps between snapshots (one RSSM entry each)
  history: int  # snapshots kept (the RSSM's training window)
  train_steps: int  # RSSM optimizer steps at each snapshot
  min_agreement: float  # a candidate needs this ensemble agreement on its expected gain
  max_scale: float  # s_g is clipped to [0, max_scale]
  rssm: dynamics_lib.RSSMConfig


# Entries of a snapshot's feature vector before the per-group ones (lr, progress, log-loss, trend).
_GLOBAL_FEATURES = 4
# Per group: log |r_g|, cos(r_g, r_g at the previous snapshot), the realised ratio a_g.
_GROUP_FEATURES = 3
# The calibration's EMA weight of a new (realised / expected) ratio, and that ratio's clip.
_CALIBRATION_RATE = 0.3
_CALIBRATION_CLIP = 2.0


@flax.struct.dataclass
class Forecast:
  """The forecaster's state (`HybridState.forecast`)."""

  dynamics: jax.Array  # the RSSM's `DynamicsState`, raveled to one float32 vector
  history: History  # one entry per snapshot
  snapshot_drift: Any  # params-shaped: the drift r at the last snapshot
  snap_dot: jax.Array  # (G,) <EMA_fast, r>_g at the last snapshot
  snap_rsq: jax.Array  # (G,) |r_g|^2 at the last snapshot
  jump_dot: jax.Array  # (G,) <accepted jumps' moves since the last snapshot, r>_g
  last_ratio: jax.Array  # (G,) the realised ratio of the last interval
  expected_gain: jax.Array  # the expected persisting gain of the last accepted jump (calibration)
  last_expected: jax.Array  # the expected gain of the last attempt's chosen (or best) candidate
  calibration: jax.Array  # EMA of realised / expected persisting gain (1 at the start)
  calibration_count: jax.Array  # int32: jumps it has learned from
  last_agreement: jax.Array  # the agreement of the last attempt's chosen (or best) candidate
  last_scale: jax.Array  # (G,) s_g of the last attempt's chosen candidate


def settings(fc: Any, n_groups: int) -> ForecastSettings:
  """`ForecastSettings` from the `hybrid.jump.forecaster` block `fc`, with its RSSM sized for snapshot entries
  of `n_groups` groups."""
  rssm = dynamics_lib.RSSMConfig(
    feature_dim=feature_dim(n_groups),
    n_groups=n_groups,
    **{k: int(fc[k]) for k in ("deter", "latent", "hidden", "ensemble")},
    learning_rate=float(fc.learning_rate),
    # An interval's log-loss change is tens of steps' worth: predicted in units of 0.02.
    dloss_scale=0.02,
  )
  return ForecastSettings(
    int(fc.every), int(fc.history), int(fc.train_steps), float(fc.min_agreement), float(fc.max_scale), rssm
  )


def feature_dim(n_groups: int) -> int:
  """Length of a snapshot's feature vector."""
  return _GLOBAL_FEATURES + _GROUP_FEATURES * n_groups


def _unravel(cfg: dynamics_lib.RSSMConfig):
  """The function that turns the raveled vector back into a `DynamicsState` (from its shapes)."""
  shapes = jax.eval_shape(lambda: dynamics_lib.init_dynamics(jax.random.PRNGKey(0), cfg))
  return ravel_pytree(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))[1]


def init_forecast(fs: ForecastSettings, params: Any, rng: jax.Array) -> Forecast:
  """A fresh forecaster: an untrained ensemble, an empty snapshot history, no drift yet."""
  g = fs.rssm.n_groups
  flat, _ = ravel_pytree(dynamics_lib.init_dynamics(rng, fs.rssm))
  zeros, zero = jnp.zeros((g,), jnp.float32), jnp.zeros((), jnp.float32)
  return Forecast(
    dynamics=flat,
    history=init_history(fs.history, feature_dim(g), g),
    snapshot_drift=jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
    snap_dot=zeros,
    snap_rsq=zeros,
    jump_dot=zeros,
    last_ratio=zeros,
    expected_gain=zero,
    last_expected=zero,
    calibration=jnp.ones((), jnp.float32),
    calibration_count=jnp.zeros((), jnp.int32),
    last_agreement=zero,
    last_scale=zeros,
  )


def run_if(pred: jax.Array, fn, operand: Any) -> Any:
  """`fn(operand)` when `pred`, else `operand`, updating `operand`'s buffers in place.

  A one-trip `lax.while_loop`: its carry shares one buffer per leaf with its input and output, where
  `lax.cond` would give its results buffers of their own and copy every leaf it passes through (the
  params-sized snapshot) at every real step. The work runs only at the steps that need it.
  """

  body = lambda carry: (jnp.asarray(False), fn(carry[1]))
  return jax.lax.while_loop(lambda carry: carry[0], body, (jnp.asarray(pred, bool), operand))[1]


def takes_snapshot(fs: ForecastSettings, real_count: jax.Array, finite: jax.Array) -> jax.Array:
  """Whether a real step snapshots: it applied its update (`finite`) and brought the count of
  applied real steps to a multiple of `every`."""
  return finite & (real_count % fs.every == 0)


def interval_ratio(f: Forecast, groups: groups_lib.ParamGroups, fast: Any, every: int) -> tuple[jax.Array, jax.Array]:
  """(a_g, valid): the realised ratio of the interval since the last snapshot, per group, and
  whether there was a drift to measure it against."""
  moved = groups_lib.group_dots(groups, fast, f.snapshot_drift) - f.snap_dot - f.jump_dot
  valid = (f.history.count > 0) & jnp.all(f.snap_rsq > 0)
  return jnp.where(valid, moved / jnp.maximum(every * f.snap_rsq, 1e-30), 0.0), valid


def snapshot(
  fs: ForecastSettings,
  groups: groups_lib.ParamGroups,
  f: Forecast,
  *,
  fast: Any,
  drift: Any,
  lr: jax.Array,
  progress: jax.Array,
  loss_fast: jax.Array,
  loss_slow: jax.Array,
  rng: jax.Array,
) -> Forecast:
  """Records one snapshot entry (and the previous entry's target), trains the ensemble
  `train_steps` steps on the snapshot window, and keeps `drift` as the new reference."""
  h = f.history
  alpha_max = fs.rssm.alpha_max
  ratio, valid = interval_ratio(f, groups, fast, fs.every)
  ratio = jnp.clip(ratio, -alpha_max, alpha_max)
  rsq = groups_lib.group_sq_norms(groups, drift)
  cos = groups_lib.group_dots(groups, drift, f.snapshot_drift) * jax.lax.rsqrt(jnp.maximum(rsq * f.snap_rsq, 1e-30))
  x = jnp.concatenate(
    [
      jnp.stack([lr, progress, loss_fast, loss_fast - loss_slow]).astype(jnp.float32),
      0.5 * groups_lib.safe_log(rsq),
      jnp.where(valid, cos, 0.0),
      ratio,
    ]
  )
  n = h.features.shape[0]
  h = h.replace(
    alpha_target=jnp.where(valid, h.alpha_target.at[(h.pos - 1) % n].set(ratio), h.alpha_target).at[h.pos].set(0.0),
    features=h.features.at[h.pos].set(x),
    logloss=h.logloss.at[h.pos].set(loss_fast),
    normalizer=trajectory_lib.update_normalizer(h.normalizer, x, max_count=float(4 * n)),
    pos=(h.pos + 1) % n,
    count=jnp.minimum(h.count + 1, n),
  )
  dyn = _unravel(fs.rssm)(f.dynamics)
  window = history_window(h, n)

  def train(i, dyn):
    return dynamics_lib.train_step(dyn, window, jax.random.fold_in(rng, i), fs.rssm)[0]

  dyn = jax.lax.fori_loop(0, fs.train_steps, train, dyn)
  return f.replace(
    dynamics=ravel_pytree(dyn)[0],
    history=h,
    snapshot_drift=drift,
    snap_dot=groups_lib.group_dots(groups, fast, drift),
    snap_rsq=rsq,
    jump_dot=jnp.zeros_like(f.jump_dot),
    last_ratio=jnp.where(valid, ratio, f.last_ratio),
  )


def aggregate(
  alpha: jax.Array,
  dlogloss: jax.Array,
  horizons: jax.Array,
  every: int,
  calibration: jax.Array,
  max_scale: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """From the ensemble's imagined intervals to each candidate's (s_g, expected gain, agreement).

  Args:
    alpha: (E, H, G) predicted realised ratios of the next H intervals.
    dlogloss: (E, H) predicted log-loss changes over them.
    horizons: (C,) each candidate's k; interval i counts with weight clip(k / D - i, 0, 1).
    every: D.
    calibration: the realised / expected gain calibration.
    max_scale: s_g's upper clip.

  Returns:
    scales (C, G), expected gain (C,), agreement (C,) in [0, 1].
  """
  n = alpha.shape[1]
  w = jnp.clip(horizons.astype(jnp.float32)[:, None] / every - jnp.arange(n, dtype=jnp.float32)[None, :], 0.0, 1.0)
  scales = (w @ jnp.mean(alpha, axis=0)) / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1e-6)
  gain = -(dlogloss @ w.T)  # (E, C): each member's expected drop of the log-loss over k steps
  mean, spread = jnp.mean(gain, axis=0), jnp.std(gain, axis=0)
  agreement = jnp.exp(-spread / jnp.maximum(jnp.abs(mean), 1e-6))  # in (0, 1]
  return jnp.clip(scales, 0.0, max_scale), calibration * mean, agreement


def forecast_moves(
  fs: ForecastSettings, f: Forecast, horizons: tuple[int, ...], rng: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Each candidate's (s_g (C, G), expected persisting gain (C,), agreement (C,)) from the ensemble's
  imagination of the intervals ahead (`horizons`: each candidate's k, static). Nothing is admitted
  before the history holds `min_valid` entries (the untrained ensemble's predictions are near 0
  anyway)."""
  n_ahead = max(1, math.ceil(max(horizons) / fs.every))
  dyn = _unravel(fs.rssm)(f.dynamics)
  imagined = dynamics_lib.imagine(dyn, history_window(f.history, f.history.features.shape[0]), n_ahead, rng, fs.rssm)
  scales, expected, agreement = aggregate(
    imagined["alpha"], imagined["dlogloss"], jnp.asarray(horizons), fs.every, f.calibration, fs.max_scale
  )
  ready = f.history.count >= fs.rssm.min_valid
  return scales, jnp.where(ready, expected, 0.0), jnp.where(ready, agreement, 0.0)


def record_jump(
  groups: groups_lib.ParamGroups, f: Forecast, amount: jax.Array, drift: Any, expected: jax.Array
) -> Forecast:
  """After an accepted jump that moved group g by amount_g r_g: its part of the interval's move
  (excluded from the realised ratio) and its expected gain (for the calibration)."""
  dots = groups_lib.group_dots(groups, drift, f.snapshot_drift)
  return f.replace(jump_dot=f.jump_dot + amount * dots, expected_gain=expected)


def calibrate(f: Forecast, realised: jax.Array, closed: jax.Array) -> Forecast:
  """Learns from one accepted jump whose persisting gain was just measured (`closed`)."""
  ratio = jnp.clip(realised / jnp.maximum(f.expected_gain, 1e-6), -_CALIBRATION_CLIP, _CALIBRATION_CLIP)
  new = (1.0 - _CALIBRATION_RATE) * f.calibration + _CALIBRATION_RATE * ratio
  return f.replace(
    calibration=jnp.where(closed, new, f.calibration),
    calibration_count=f.calibration_count + closed.astype(jnp.int32),
  )
