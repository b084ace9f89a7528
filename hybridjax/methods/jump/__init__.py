"""The jump predictor (`hybrid.method='jump'`): long moves along the drift of the averaged iterate,
with its optional RSSM forecaster (`hybrid.jump.forecast='rssm'`). See `hybrid.jump` and
`hybrid.forecast` for the algorithm, docs/design.md "Jumps" and "Forecast" for the account.

  real step      the baseline's update, the slow EMA, the persisting-gain measurement, and every
                 `forecaster.every` real steps the forecaster's snapshot (`full_step`)
  predicted step one attempt: candidates scored on the probe batch, then a jump of k schedule steps
                 or nothing (`jump_step`); the batch is not consumed
  CORRECT entry  a real step (a rejected jump changes nothing, so nothing is rolled back)

It reads the train state's averaging EMA (the drift's fast EMA) and composes with outer momentum,
whose m then gives the drift. Its control arm (`jump.skip_control`) makes the same decisions but an
accepted jump only advances the schedule.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from hybridjax import schema
from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.phases import BRANCH_NAMES, Branch
from hybridjax.hybrid.state import Controller, HybridState
from hybridjax.methods.jump import forecast as forecast_lib
from hybridjax.methods.jump import steps as jump_lib

NAME = "jump"
CONFIG_KEY = "jump"
COMPOSES_WITH = frozenset({"outer_momentum"})
# A jump advances the schedule by k and leaves its batch to the next step: the loop reads both
# counters from the device.
ADVANCES_SCHEDULE = True
CONTROL = {"jump.skip_control": True}
# One attempt per `jump.every` real steps: too rare in a run to time, so the benchmark times it apart.
TIME_BRANCHES = (Branch.PREDICT_STEP,)
# Metrics that belong to a step's trace record only (not to the periodic log record).
TRACE_ONLY = frozenset({"jump_k", "jump_scale", "probe_gain", "expected_gain", "forecast_agreement", "snapshot"})


F = schema.Field
_int, _num = schema.check_int, schema.check_num
# The `hybrid.jump` block. The jump needs `trainer.averaging='ema'`, whose EMA is the drift's fast one.
FIELDS: tuple[schema.Field, ...] = (
  F(
    "horizons",
    (50, 100, 200),
    schema.check_int_tuple(1),
    "candidate k (schedule steps a jump advances), scored one at a time",
  ),
  F(
    "scales",
    (1.0,),
    schema.check_num_tuple(0.0),
    "move scales s: candidate (k, s) moves s k r and advances the schedule by k",
  ),
  F("every", 100, _int(1), "real steps between jump attempts (the CORRECT phase that measures a jump's persistence)"),
  F(
    "margin",
    0.0,
    _num(-1.0, 1.0, hi_open=True),
    "accept the best k only if its probe loss < (1 - margin) x the no-jump loss",
  ),
  F("trend_credit", 0.0, _num(0.0), "and by this fraction of the k real steps' expected progress (1: all of it)"),
  F(
    "slow_beta",
    0.998,
    _num(0.0, 1.0, lo_open=True, hi_open=True),
    "the slow EMA; drift r = (EMA_fast - EMA_slow) / (lag_slow - lag_fast)",
  ),
  F(
    "slow_lag_ratio",
    0.0,
    _num(0.0),
    "> 0: the slow EMA lags this many times the averaging EMA instead, whatever its beta: "
    "slow_beta = 1 - (1 - trainer.averaging_beta) / ratio (2: 0.995 at 0.99); 0 = slow_beta",
  ),
  F("start_fraction", 0.05, _num(0.0, 1.0), "no jump before this fraction of the run"),
  F("stop_fraction", 0.6, _num(0.0, 1.0), "nor one that would end past this fraction (low LR)"),
  F("skip_control", False, schema.check_bool, "True: an accepted jump advances the schedule by k, moving no weight"),
  F(
    "forecast",
    "none",
    schema.check_choice("none", "rssm"),
    "'rssm': an RSSM ensemble over trajectory snapshots sets s_g and admits candidates",
  ),
  # The RSSM forecaster (forecast='rssm'; docs/design.md "Forecast"):
  F("forecaster.every", 50, _int(1), "real steps between snapshots (one RSSM entry; it trains here)"),
  F("forecaster.history", 32, _int(4, 4096), "snapshots kept: the RSSM's training window"),
  F("forecaster.train_steps", 4, _int(0), "RSSM optimizer steps per snapshot"),
  F(
    "forecaster.min_agreement", 0.5, _num(0.0, 1.0), "exp(-std/|mean|) of the members' expected gains a candidate needs"
  ),
  F("forecaster.max_scale", 2.0, _num(0.0, lo_open=True), "s_g is clipped to [0, max_scale]"),
  F("forecaster.deter", 32, _int(1), "the forecaster's RSSM: GRU state size"),
  F("forecaster.latent", 8, _int(1), "its Gaussian latent size"),
  F("forecaster.hidden", 32, _int(1), "its MLP width"),
  F("forecaster.ensemble", 3, _int(2), "members (their disagreement on the gain is the gate)"),
  F("forecaster.learning_rate", 3e-3, _num(0.0, lo_open=True), "its Adam learning rate"),
)


def check(config: ml_collections.ConfigDict) -> list[str]:
  """What a jump needs of the rest of the run."""
  j, trainer = config.hybrid.jump, config.trainer
  outer_every = config.get("optim", {}).get("outer_every")
  ratio = j.get("slow_lag_ratio", 0.0)
  errors = []
  if trainer.get("averaging", "none") != "ema":
    errors.append(
      "--config.hybrid.method='jump' needs --config.trainer.averaging='ema' (the averaging EMA is the fast EMA "
      "of the drift); set it, or use --config.hybrid.method='velocity'"
    )
  default_slow_beta = schema.by_name(FIELDS)["slow_beta"].default
  if j.slow_beta != default_slow_beta and (outer_every or ratio):
    # A slow_beta that nothing reads would be recorded as the run's setting without a word.
    why = (
      f"--config.optim.outer_every ({outer_every}) > 0: outer momentum's m gives the drift, with no slow EMA"
      if outer_every
      else f"--config.hybrid.jump.slow_lag_ratio ({ratio}) > 0 sets the slow EMA's beta from "
      f"--config.trainer.averaging_beta instead (1 - (1 - averaging_beta) / slow_lag_ratio)"
    )
    fix = "--config.optim.outer_every=0" if outer_every else "--config.hybrid.jump.slow_lag_ratio=0"
    errors.append(
      f"--config.hybrid.jump.slow_beta ({j.slow_beta}) is set but unused: {why}. Set {fix} to use it, or leave "
      f"hybrid.jump.slow_beta at its default ({default_slow_beta})"
    )
  if ratio and ratio <= 1.0:
    errors.append(
      f"--config.hybrid.jump.slow_lag_ratio ({ratio}) must be > 1 (the slow EMA must be slower than "
      "the averaging EMA), or 0 to use hybrid.jump.slow_beta"
    )
  elif not outer_every and not ratio and j.slow_beta <= trainer.get("averaging_beta", 0.0):
    errors.append(
      f"--config.hybrid.jump.slow_beta ({j.slow_beta}) must be > --config.trainer.averaging_beta "
      f"({trainer.get('averaging_beta')}): the drift is the two EMAs' difference over their lag difference, "
      "zero when the slow EMA is not slower; raise hybrid.jump.slow_beta"
    )
  if j.forecast != "none" and outer_every:
    errors.append(
      "--config.hybrid.jump.forecast='rssm' measures the averaged iterate's moves against the slow EMA's drift, "
      "which outer momentum replaces: set --config.optim.outer_every=0 or --config.hybrid.jump.forecast='none'"
    )
  if j.start_fraction >= j.stop_fraction:
    errors.append(
      f"--config.hybrid.jump.start_fraction ({j.start_fraction}) must be < --config.hybrid.jump.stop_fraction "
      f"({j.stop_fraction})"
    )
  elif j.horizons and trainer.get("steps") is not None:
    # The window `steps.in_jump_window` admits: a run where the longest horizon never fits would train
    # as its baseline and report a jump arm that never jumped.
    start, stop = jump_lib.window_bounds(j.start_fraction, j.stop_fraction, int(trainer.steps))
    longest = max(int(k) for k in j.horizons)
    if start + longest > stop:
      errors.append(
        f"--config.hybrid.jump.horizons (longest {longest}) never fits this run's jump window: a jump starts at "
        f"or after start_fraction x trainer.steps ({start}) and ends by stop_fraction x trainer.steps ({stop}), "
        f"so no jump would ever be taken. Give horizons of at most {stop - start} steps, widen "
        "--config.hybrid.jump.start_fraction/stop_fraction, or lengthen --config.trainer.steps"
      )
  return errors


def make_settings(hybrid: ml_collections.ConfigDict, *, groups: groups_lib.ParamGroups) -> jump_lib.JumpSettings:
  j = hybrid.jump
  return jump_lib.JumpSettings(
    horizons=tuple(int(k) for k in j.horizons),
    scales=tuple(float(x) for x in j.get("scales", (1.0,))),
    margin=float(j.margin),
    trend_credit=float(j.get("trend_credit", 0.0)),
    slow_beta=float(j.slow_beta),
    slow_lag_ratio=float(j.get("slow_lag_ratio", 0.0)),
    start_fraction=float(j.start_fraction),
    stop_fraction=float(j.stop_fraction),
    skip_control=bool(j.skip_control),
    forecast=forecast_lib.settings(j.forecaster, groups.n_groups) if j.get("forecast", "none") == "rssm" else None,
  )


def control(hybrid: ml_collections.ConfigDict, settings: jump_lib.JumpSettings) -> dict[str, Any]:
  """The generic controller's settings a jump fixes: one PREDICT step (the attempt), no
  micro-corrections, and `jump.every` real steps between attempts."""
  del settings
  return {"max_predict_steps": 1, "correct_steps": int(hybrid.jump.every), "correction_interval": 0}


def init(ctx: HybridContext, params: Any, rng: jax.Array) -> jump_lib.JumpState:
  """The slow EMA (none with outer momentum, whose m gives the drift), the forecaster, no jumps. The
  slow EMA and the forecaster's snapshot drift are params-shaped: on a mesh they are laid out like the
  params (the default `shardings`), the rest replicated."""
  s: jump_lib.JumpSettings = ctx.settings
  # The forecaster's key is folded from the state's, so adding it changes no other draw.
  forecast_rng = jax.random.fold_in(jax.random.split(rng, 3)[0], 1)
  slow_beta = s.slow_beta
  if s.slow_lag_ratio > 0:  # the lag ratio to the averaging EMA, whatever beta the run averages with
    slow_beta = 1.0 - (1.0 - float(ctx.averaging_beta)) / s.slow_lag_ratio
  return jump_lib.JumpState(
    drift_memory=jump_lib.init_drift_memory(params, slow_beta) if ctx.outer is None else None,
    forecast=None if s.forecast is None else forecast_lib.init_forecast(s.forecast, params, forecast_rng),
    tracker=jump_lib.init_tracker(ctx.groups.n_groups),
  )


# The transitions: a real step (also the CORRECT entry) and the jump as the predicted step.
full_step = jump_lib.full_step
predict_step = jump_lib.jump_step


def metrics(ctx: HybridContext, state: HybridState, info: StepInfo) -> dict[str, jax.Array]:
  t, f = state.method.tracker, state.method.forecast
  jumped = ~info.batch_consumed  # only a jump step leaves its batch for the next step
  out = {
    "jump_k": jnp.where(jumped, t.last_jump_k, 0),  # schedule steps this jump advanced (0: rejected)
    "jump_scale": jnp.where(jumped, t.last_jump_scale, 0.0),  # its move: jump_scale * jump_k steps of drift
    "probe_gain": jnp.where(jumped, t.last_probe_gain, jnp.nan),
    "persisting_gain": t.last_persisting_gain,
  }
  if f is not None:
    out.update(
      # The forecaster's expected persisting gain of this attempt's chosen candidate, its ensemble
      # agreement, and the calibration (realised / expected, learned over the accepted jumps).
      expected_gain=jnp.where(jumped, f.last_expected, jnp.nan),
      forecast_agreement=jnp.where(jumped, f.last_agreement, jnp.nan),
      calibration=f.calibration,
      # This real step took a snapshot (and trained the RSSM): a step kind of its own cost.
      snapshot=info.was_real
      & forecast_lib.takes_snapshot(ctx.settings.forecast, state.controller.real_count, info.finite),
    )
  return out


def trace(row: dict[str, Any], predicted: bool) -> dict[str, Any]:
  """A step's trace-record fields from its fetched metrics row; `predicted`: a PREDICT-phase step (an
  attempt: `loss` is then the probe loss where the params now are, `predicted_loss` the probe loss
  without a jump)."""
  out = {"persisting_gain": float(row["persisting_gain"])}
  if predicted:
    out.update(jump_k=int(row["jump_k"]), jump_scale=float(row["jump_scale"]), probe_gain=float(row["probe_gain"]))
    if "expected_gain" in row:  # the RSSM forecaster's view of this attempt
      out.update(expected_gain=float(row["expected_gain"]), forecast_agreement=float(row["forecast_agreement"]))
  if "snapshot" in row:
    out["snapshot"] = bool(row["snapshot"])
  return out


def step_kind(row: dict[str, Any]) -> str:
  """A step's cost class: an attempt (probe forwards, then a jump or nothing), a real step, or a
  real step that took the forecaster's snapshot (rare and dearer: a median over all real steps
  would hide it)."""
  if row.get("snapshot"):
    return "full_step+snapshot"
  if int(row["branch"]) == Branch.PREDICT_STEP:
    return "jump_step"
  return BRANCH_NAMES[int(row["branch"])]


def summary(ctx: HybridContext, state: jump_lib.JumpState, controller: Controller) -> dict[str, Any]:
  t = state.tracker
  n_gain = int(t.persisting_gain_count)
  return {
    # jump_steps: schedule steps advanced without a batch or a backward pass.
    **{k: int(getattr(t, k)) for k in ("jump_attempts", "jumps", "jump_steps")},
    "probe_forwards": int(controller.forward_passes),
    "mean_persisting_gain": float(t.persisting_gain_sum) / n_gain if n_gain else None,
    "skip_control": bool(ctx.settings.skip_control),
  }
