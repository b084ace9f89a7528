"""Metric writers: one JSON object per line (`metrics.jsonl`) plus TensorBoard event files."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def _to_python(v: Any) -> Any:
  if isinstance(v, (np.generic, np.ndarray)):
    v = v.item() if np.ndim(v) == 0 else np.asarray(v).tolist()
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

  def __init__(self, workdir: str, *, tensorboard: bool = True, keep_through: int | None = None):
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
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # imported lazily: slow-ish import

      self._tb = SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: Mapping[str, Any], *, kind: str = "train") -> None:
    record = {"step": int(step), "kind": kind}
    record.update({k: _to_python(v) for k, v in metrics.items()})
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in record.items():
        if k in ("step", "kind"):
          continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(f"{kind}/{k}", v, int(step))

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
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
