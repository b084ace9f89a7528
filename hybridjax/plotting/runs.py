"""Reading a run's workdir: what `hybridjax.loop.train.train` writes, as a `Run`.

  metrics.jsonl  one JSON object per line, with "step" and "kind":
                 "train" (every log_every steps), "step" (hybrid: one per step), "eval", "memory"
                 (hybrid: at phase transitions with host dispatch; at the log that saw one, fused)
  summary.json   the run summary (mode, timings, memory, and in hybrid mode phase counts and the
                 names of the parameter groups in the order of every per-group list)

so it works on finished, running, crashed and resumed runs alike. Also the series the figures draw:
eval curves, memory readings, prediction pairs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any, Union

import numpy as np

from hybridjax.plotting.style import FULL, PREDICT, WARMUP
from hybridjax.writers import read_jsonl

EVAL_X = {
  "step": "step",
  "train_s": "training seconds (compile, eval, checkpoints excluded)",
  "backward_passes": "backward passes",
}


@dataclasses.dataclass(frozen=True)
class Run:
  """One run's metrics, by kind, in step order with one record per (kind, step), and its summary.

  Attributes:
    workdir: the run directory.
    name: a short label (the workdir's base name unless given).
    records: kind ("train", "step", "eval", "memory", ...) -> records sorted by step.
    summary: summary.json, or {} while the run has not finished.
  """

  workdir: str
  name: str
  records: Mapping[str, tuple[dict[str, Any], ...]]
  summary: Mapping[str, Any]

  @property
  def mode(self) -> str:
    """'hybrid' or 'baseline' (from the summary, else from what the metrics hold)."""
    if self.summary.get("mode"):
      return str(self.summary["mode"])
    hybrid = self.records.get("step") or any("phase_now" in r for r in self.records.get("train", ()))
    return "hybrid" if hybrid else "baseline"

  @property
  def is_hybrid(self) -> bool:
    return self.mode == "hybrid"

  @property
  def predicts(self) -> bool | None:
    """Whether the run's method can predict: the summary's `predicts` (False for a method whose
    control turns PREDICT off); before the summary, True once a step was in PREDICT, else None
    (not known yet). False for a baseline run."""
    if not self.is_hybrid:
      return False
    if "predicts" in self.summary:
      return bool(self.summary["predicts"])
    return any(r.get("phase") == PREDICT for r in self.kind("step")) or None

  def kind(self, kind: str) -> tuple[dict[str, Any], ...]:
    """The records of one kind, in step order (empty if there are none)."""
    return self.records.get(kind, ())

  def series(self, kind: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the records of `kind` that hold a scalar `key`; NaN for non-numbers."""
    recs = [r for r in self.kind(kind) if key in r and not isinstance(r[key], (list, dict))]
    return (np.array([r["step"] for r in recs], np.int64), np.array([as_float(r[key]) for r in recs], np.float64))

  def group_names(self, n_groups: int | None = None) -> list[str]:
    """Names of the parameter groups, in the order of every per-group list in the metrics."""
    names = list(self.summary.get("group_names") or [])
    if n_groups is not None and len(names) != n_groups:  # summary missing (run not finished)
      names = [f"group {i}" for i in range(n_groups)]
    return names


def load_run(workdir: str, name: str | None = None) -> Run:
  """Reads `<workdir>/metrics.jsonl` (and `summary.json` if present) into a `Run`.

  A resumed run appends to metrics.jsonl and re-logs the steps after its checkpoint: for every
  kind, a step that goes back marks a restart, and the records it supersedes are dropped, so the
  last record of each step wins. A line cut short by a crash is skipped.

  Raises:
    ValueError: if the workdir holds no metrics.jsonl.
  """
  workdir = os.fspath(workdir)
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise ValueError(
      f"{workdir!r} has no metrics.jsonl, so it is not a run directory: pass the --workdir of a "
      "`python -m experiments.gpt2_small` run, or the folder of any one train() run"
    )
  summary: dict[str, Any] = {}
  summary_path = os.path.join(workdir, "summary.json")
  if os.path.isfile(summary_path):
    with open(summary_path, encoding="utf-8") as f:
      summary = json.load(f)
  return Run(
    workdir=workdir,
    name=name or os.path.basename(os.path.normpath(workdir)),
    records=_dedupe(read_jsonl(path)),
    summary=summary,
  )


def _dedupe(lines: Iterable[Mapping[str, Any]]) -> dict[str, tuple[dict[str, Any], ...]]:
  by_kind: dict[str, dict[int, dict[str, Any]]] = {}  # kind -> step -> record, steps in increasing order
  for rec in lines:
    if not isinstance(rec, dict) or "step" not in rec:
      continue
    step = int(rec["step"])
    series = by_kind.setdefault(rec.get("kind", "train"), {})
    if series and step <= next(reversed(series)):
      # Steps of one kind only grow within one process: this is a resumed run re-logging from its
      # checkpoint, and everything the crashed process logged from here on is superseded.
      for s in [s for s in series if s >= step]:
        del series[s]
    series[step] = dict(rec)
  return {k: tuple(v.values()) for k, v in by_kind.items()}


def as_float(v: Any) -> float:
  """A metric value as a float: the writer stores non-finite numbers as strings ('nan', 'inf')."""
  try:
    return float(v)  # None and strings other than numbers: NaN
  except (TypeError, ValueError):
    return math.nan


RunLike = Union[Run, str, "os.PathLike[str]"]


def as_run(run: RunLike) -> Run:
  """`run` itself, or the run in the workdir `run` names."""
  return run if isinstance(run, Run) else load_run(run)


def as_runs(runs: Any) -> dict[str, Run]:
  """A Run, a workdir, a sequence of them, or a name -> Run/workdir mapping, as name -> Run."""
  if isinstance(runs, (Run, str, os.PathLike)):
    runs = [runs]
  if isinstance(runs, Mapping):
    return {str(k): as_run(v) for k, v in runs.items()}
  out: dict[str, Run] = {}
  for r in runs:
    r = as_run(r)
    name, i = r.name, 2
    while name in out:  # two workdirs with the same base name
      name, i = f"{r.name} ({i})", i + 1
    out[name] = r
  if not out:
    raise ValueError("no runs given")
  return out


def require_hybrid(run: Run, what: str) -> None:
  """Raises a ValueError naming the run and the mode when `run` is not a hybrid run."""
  if not run.is_hybrid:
    raise ValueError(
      f"run {run.name!r} ({run.workdir}) is a {run.mode} run: {what} exists only in hybrid mode (--config.mode=hybrid)"
    )


def step_trace(run: Run) -> dict[str, np.ndarray]:
  """The per-step trace of a hybrid run as arrays."""
  recs = run.kind("step")
  if not recs:
    raise ValueError(
      f"run {run.name!r} ({run.workdir}) has no per-step records (kind 'step') in "
      "metrics.jsonl yet: they are written at every log step of a hybrid run"
    )

  def get(key: str) -> np.ndarray:
    return np.array([as_float(r.get(key)) for r in recs])

  return {
    "step": np.array([r["step"] for r in recs], np.int64),
    "phase": np.array([int(r.get("phase", FULL)) for r in recs], np.int64),
    "loss": get("loss"),
    "predicted_loss": get("predicted_loss"),
    "confidence": get("confidence"),
    "measured": np.array([bool(r.get("measured", True)) for r in recs]),
    "diverged": np.array([bool(r.get("diverged", False)) for r in recs]),
  }


def prediction_pairs(run: RunLike) -> dict[str, np.ndarray]:
  """Predicted and realised loss of every measured step of a hybrid run, aligned in time.

  A predicted step's record holds its own prediction and, when validated, the loss measured after
  its move: that pair is used as is. A real step's record holds the one-step-ahead prediction the
  step made *for the next step* (`exp(plan_logloss[0])`), so a real step's realised loss is paired
  with the prediction of the real step before it.

  Returns:
    Arrays step, phase (of the measured step), predicted, realised and confidence (at the time of
    the prediction).
  """
  run = as_run(run)
  require_hybrid(run, "a predicted loss")
  t = step_trace(run)
  s, phase = t["step"], t["phase"]
  is_pred = phase == PREDICT
  own = is_pred & t["measured"]
  prev_real = np.zeros_like(own)
  prev_real[1:] = (~is_pred[1:]) & (~is_pred[:-1]) & (np.diff(s) == 1)
  idx_own = np.nonzero(own)[0]
  idx_real = np.nonzero(prev_real)[0]
  idx = np.concatenate([idx_own, idx_real])
  src = np.concatenate([idx_own, idx_real - 1])  # where the prediction (and confidence) came from
  order = np.argsort(s[idx], kind="stable")
  idx, src = idx[order], src[order]
  out = {
    "step": s[idx],
    "phase": phase[idx],
    "predicted": t["predicted_loss"][src],
    "realised": t["loss"][idx],
    "confidence": t["confidence"][src],
  }
  ok = np.isfinite(out["predicted"]) & np.isfinite(out["realised"])
  return {k: v[ok] for k, v in out.items()}


def after_warmup(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The per-step arrays `p` (prediction pairs, a step trace) without their WARMUP steps, unless all are WARMUP."""
  # During WARMUP nothing is predicted and the loss falls fast: those points would set the axes.
  keep = p["phase"] != WARMUP
  return {k: v[keep] for k, v in p.items()} if np.any(keep) else p


def memory_series(run: RunLike) -> tuple[np.ndarray, np.ndarray]:
  """(steps, bytes_in_use) from the log records and the phase-transition readings, by step."""
  run = as_run(run)
  pts: dict[int, float] = {}
  for kind in ("memory", "train"):  # a log reading wins over a transition reading at one step
    s, b = run.series(kind, "bytes_in_use")
    pts.update(zip(s.tolist(), b.tolist()))
  steps = np.array(sorted(pts), np.int64)
  return steps, np.array([pts[s] for s in steps.tolist()], np.float64)


def eval_curve(run: RunLike, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
  """(x, eval loss) of one run, x in {'step', 'train_s', 'backward_passes'}.

  train_s and backward_passes come from the train record at each eval step (eval steps are
  multiples of log_every; otherwise they are interpolated between log steps). train_s restarts at
  0 when a run resumes; it is made cumulative again here. A baseline's backward passes are its steps.
  """
  if x not in EVAL_X:
    raise ValueError(f"x must be one of {list(EVAL_X)}, got {x!r}")
  run = as_run(run)
  es, ev = run.series("eval", "eval_loss")
  if x == "step" or not len(es) or (x == "backward_passes" and not run.is_hybrid):
    return es.astype(np.float64), ev
  ts, tv = run.series("train", x)
  ok = np.isfinite(tv)
  ts, tv = ts[ok], tv[ok]
  if not len(ts):
    raise ValueError(f"run {run.name!r} ({run.workdir}) logs no {x!r} in its train records")
  if x == "train_s":
    tv = _cumulative(tv)
  return np.interp(es, ts, tv), ev


def _cumulative(v: np.ndarray) -> np.ndarray:
  """Undoes the restart of a per-process cumulative counter at each resume."""
  return v + np.cumsum(np.concatenate([[0.0], np.where(v[1:] < v[:-1], v[:-1], 0.0)]))
