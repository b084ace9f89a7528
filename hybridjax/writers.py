"""Metric writers: one JSON object per line (`metrics.jsonl`) plus TensorBoard event files."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from hybridjax import memory as memory_lib


def _to_python(v: Any) -> Any:
  if isinstance(v, (np.generic, np.ndarray)):
    v = v.item() if np.ndim(v) == 0 else v.tolist()
  if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
    try:
      v = v.item()
    except (TypeError, ValueError):
      pass
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)  # JSON has no NaN/Inf; keep them readable
  return v


class MetricWriter:
  """Writes scalar metrics to `<workdir>/metrics.jsonl` and TensorBoard (`<workdir>/tb`).

  JSONL lines are appended, so a resumed run continues the same file (TensorBoard shows a replayed
  step's newer value).
  """

  def __init__(self, workdir: str, *, keep_through: int | None = None):
    """`keep_through`: the step a run resumes from. The records of later steps, which the resumed
    run replays and writes again, are dropped from the file first, so no step appears twice."""
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    if keep_through is not None and os.path.exists(self.path):
      kept = [r for r in read_jsonl(self.path) if int(r.get("step", 0)) <= keep_through]
      with open(self.path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
      os.replace(self.path + ".tmp", self.path)  # a crash here leaves the old file or the new, whole
    self._file = open(self.path, "a", encoding="utf-8")
    from tensorboardX import SummaryWriter  # imported lazily: slow-ish import

    self._tb = SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: Mapping[str, Any], *, kind: str = "train") -> None:
    record = {"step": int(step), "kind": kind} | {k: _to_python(v) for k, v in metrics.items()}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    for k, v in record.items():
      if k not in ("step", "kind") and isinstance(v, (int, float)) and not isinstance(v, bool):
        self._tb.add_scalar(f"{kind}/{k}", v, int(step))

  def close(self) -> None:
    self._file.close()
    self._tb.close()


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """Reads a metrics file written by `MetricWriter`. A line cut short (a process killed while
  writing it) is skipped."""
  records = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records


def format_loss(record: Mapping[str, Any]) -> str:
  """A train record's loss for the progress bar: "discarded" when the log's step was a predicted
  step the framework discarded, "nan"/"inf" when the loss was non-finite, never an older loss."""
  return "discarded" if record.get("discarded") else f"{record['loss']:.3f}"


def format_value(v: Any) -> str:
  """A number as 4 significant digits, anything else as `str`."""
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def format_table(rows: list[tuple[str, Any]], title: str = "") -> str:
  """A two-column text table."""
  width = max(len(k) for k, _ in rows)
  lines = [title, "-" * (width + 24)] if title else []
  lines += [f"{k:<{width}}  {format_value(v)}" for k, v in rows]
  return "\n".join(lines)


def format_summary(summary: Mapping[str, Any]) -> str:
  """The run summary as a text table."""
  rows = [
    ("mode", summary["mode"]),
    ("steps", f"{summary['start_step']} -> {summary['steps']}"),
    ("first train loss", summary["first_train_loss"]),
    ("final eval loss", summary["final_eval_loss"]),
  ]
  raw, averaged = summary.get("final_eval_loss_raw"), summary.get("final_eval_loss_averaged")
  if raw is not None and averaged is not None:  # an averaging run: both, and which weights are better
    better = "averaged" if averaged <= raw else "raw"
    rows.append(("eval loss raw / averaged", f"{raw:.4g} / {averaged:.4g} (the {better} weights are better)"))
  rows += [
    ("compile s", summary["compile_s"]),
    ("train s", summary["train_s"]),
    ("s / step", summary["s_per_step"]),
  ]
  if "tokens_per_s" in summary:
    rows.append(("tokens / s", f"{summary['tokens_per_s']:.0f}"))
  for k in (
    "phase_steps",
    "phase_ms_per_step",
    "backward_passes",
    "backward_passes_saved",
    "predicted_steps_discarded",
    "validation_forwards",
    "predict_fraction",
    "predict_phases",
    "rollbacks",
    "health_events",
    "nonfinite_skipped",
    "dispatch",
  ):
    if k in summary:
      rows.append((k.replace("_", " "), summary[k]))
  if m := summary.get("memory"):
    fb = memory_lib.format_bytes
    rows += [
      (f"memory start ({m['source']})", fb(m["start_bytes"])),
      ("memory peak", fb(m["peak_bytes"])),
      ("memory end", fb(m["end_bytes"])),
      ("memory growth after warm-up", fb(m["growth_bytes"])),
      ("RSS start / peak / end", f"{fb(m['start_rss'])} / {fb(m['peak_rss'])} / {fb(m['end_rss'])}"),
    ]
  table = format_table(rows, title="run summary")
  return "\n".join([table] + [f"WARNING: {w}" for w in summary.get("warnings", [])])
