"""The optimizers study's figures, pure functions of its record (the tests recompute them)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from hybridjax.bench import factor, tuning

# The readings a record written today holds: 2 adds the interpolated readings beside the fitted ones and
# reads the verdict against 1.0x (`factor.verdict_against_one`; the published records, without the field,
# are of 1: against 1.5x, and re-read as published).
READINGS = 2
FIELD_PATH = os.path.join(os.path.dirname(__file__), *[".."] * 4, "docs", "results", "optimizers", "field.json")


def loss_of(run: dict[str, Any], settings: dict[str, Any]) -> float:
  """A run's loss as its side reads it: its published iterate, at its beta."""
  return tuning.iterate_loss(run, settings["iterate"], float(settings["beta"]))


def grouped(per_batch: list[float], groups: int) -> list[float]:
  """Per-batch eval losses read in `groups` groups of consecutive batches: a cell at a smaller batch scores
  the same windows in more batches, and reads them in the preset's groups (`cell['eval_groups']`)."""
  x = np.asarray(per_batch, dtype=np.float64)
  if groups <= 0 or x.size % groups:
    raise ValueError(f"{x.size} eval batches do not fall into {groups} equal groups")
  return [float(v) for v in x.reshape(groups, -1).mean(axis=1)]


def side_curves(result: dict[str, Any], side: str, iterate: str | None = None) -> dict[str, dict[str, Any]]:
  """Per headline seed, a side's budget curve as `factor.curves_from` reads it: its budgets (steps), its
  losses and, where the side reads its averaged iterate (whose per-window losses the runs keep), each
  run's loss on each eval window (each group of windows, where the cell names `eval_groups`). `iterate`:
  'raw' reads every run's raw iterate instead of the side's."""
  rec, n = result["sides"][side], int(result["steps"])
  groups = result["cell"].get("eval_groups")
  settings = rec["settings"] if iterate is None else rec["settings"] | {"iterate": iterate}
  out = {}
  for s in result["seeds"]:
    runs = [rec["runs"][f"{s}/{round(float(f) * n)}"] for f in rec["budgets"]]
    windows = settings["iterate"] == "averaged" and all("final_averaged_per_batch" in r for r in runs)
    out[str(s)] = {
      "steps": [int(r["steps"]) for r in runs],
      "loss": [loss_of(r, settings) for r in runs],
      "per_window": [
        grouped(r["final_averaged_per_batch"], int(groups)) if groups else r["final_averaged_per_batch"] for r in runs
      ]
      if windows
      else None,
    }
  return out


def cell_figures(result: dict[str, Any]) -> dict[str, Any]:
  """{"factor": both readings with their intervals (`factor.factor`), "verdict": the cell's against the
  field (`factor.cell_verdict` of reading (a)), "factor_raw": the same readings of both sides' raw
  iterates, printed beside the chosen ones (None where both sides read their raw iterate already)}; a
  record of `READINGS` 2 or later (the published ones predate it) adds "interpolated": both readings
  without the fit (`factor.interpolated`), printed beside the fitted ones."""

  def read(iterate: str | None) -> dict[str, Any]:
    return factor.factor(
      side_curves(result, "adamw", iterate),
      side_curves(result, "muon", iterate),
      int(result["steps"]),
      int(result["draws"]),
      int(result["bootstrap_seed"]),
    )

  f = read(None)
  raw = None if all(s["settings"]["iterate"] == "raw" for s in result["sides"].values()) else read("raw")
  out = {"factor": f, "verdict": factor.cell_verdict(f["a"]), "factor_raw": raw}
  if result.get("readings", 1) >= 2:
    curves = [side_curves(result, side) for side in ("adamw", "muon")]
    out["interpolated"] = factor.interpolated(*curves, int(result["steps"]))
    out["verdict_against_one"] = factor.verdict_against_one(f["a"], field_range())
    out["verdict"] = out["verdict_against_one"]["verdict"]
  return out


def field_range() -> tuple[float, float]:
  """The field's range of Muon's factor over a tuned AdamW: the lowest and highest of the rows of
  docs/results/optimizers/field.json marked `in_range`."""
  with open(FIELD_PATH, encoding="utf-8") as f:
    rows = [r for r in json.load(f)["rows"] if r.get("in_range")]
  return min(r["low"] for r in rows), max(r["high"] for r in rows)


def lr_edge(check: dict[str, Any]) -> str:
  """'low' or 'high' where the local check's chosen LR is the lowest or highest it tried at the chosen beta2
  ('' inside them)."""
  chosen = check["chosen"]
  lrs = [
    t["fields"]["optim.learning_rate"]
    for t in check["tried"]
    if all(t["fields"][k] == v for k, v in chosen.items() if k != "optim.learning_rate")
  ]
  lr = chosen["optim.learning_rate"]
  return "low" if lr == min(lrs) else "high" if lr == max(lrs) else ""
