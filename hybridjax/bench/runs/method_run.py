"""A method arm's run: the library's own `train()` on the spec's task, in the arm's mode, with its
method; what the benchmark keeps of it (final losses raw and averaged, passes, step counts by kind,
the eval curve, the method's own summary figures)."""

from __future__ import annotations

import collections
import os
import shutil
from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax import writers
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import tasks as tasks_lib
from hybridjax.loop import train as train_lib


def run_method(spec: dict[str, Any], workdir: str, compile_cache_dir: str | None = None) -> dict[str, Any]:
  """A hybrid (or baseline-mode) arm through `train()`: an interrupted run continues from its last
  checkpoint, or starts again when it has none."""
  c = ml_collections.ConfigDict(spec["config"])
  c.trainer.update(
    progress=False, compile_cache=compile_cache_dir is not None, compile_cache_dir=compile_cache_dir or ""
  )
  task = tasks_lib.build(spec["task"], c)
  checkpoints = os.path.join(workdir, "checkpoints")
  if os.path.isdir(workdir) and not (os.path.isdir(checkpoints) and os.listdir(checkpoints)):
    # An interrupted run with no checkpoint starts again from step 0: its old records would be
    # counted twice (the metrics file is appended to).
    shutil.rmtree(workdir)
  summary = train_lib.train(c, workdir, save_on_interrupt=False, **task)  # the run cache is the unit of resume
  records = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  curve = [{k: r[k] for k in ("step", "eval_loss_raw", "eval_loss_averaged")} for r in records if r["kind"] == "eval"]
  arm = arms_lib.Arm(name=spec["method"], method=c.hybrid.method or config_lib.DEFAULT_METHOD, mode=c.mode)
  kinds = dict(collections.Counter(arms_lib.step_kind(arm, r) for r in records if r["kind"] == "step"))
  if c.mode == "baseline":  # every step a real one, no validation
    summary.update(
      backward_passes=c.trainer.steps, validation_forwards=0, phase_steps={c.mode: c.trainer.steps}, rollbacks=0
    )
    kinds = {arms_lib.REAL_STEP: c.trainer.steps}
  if sum(kinds.values()) != sum(summary["phase_steps"].values()):  # a jump is one step of k schedule steps
    raise RuntimeError(f"{workdir}: {sum(kinds.values())} step records for {summary['phase_steps']} steps")
  # The method's own summary figures (e.g. the jump predictor's accepted jumps): numbers only.
  stats = {
    k: v
    for k, v in summary.get("method_summary", {}).items()
    if isinstance(v, (int, float)) and not isinstance(v, bool) or v is None
  }
  return {
    "kind": "method",
    "method": spec["method"],
    "seed": int(c.seed),
    "lr": float(c.optim.learning_rate),
    "steps": int(c.trainer.steps),
    "final_loss": summary["final_eval_loss"],
    "final_raw": summary["final_eval_loss_raw"],
    "final_averaged": summary["final_eval_loss_averaged"],
    "backward_passes": summary["backward_passes"],
    "validation_forwards": summary["validation_forwards"],
    "phase_steps": summary["phase_steps"],
    "step_kinds": kinds,
    "rollbacks": summary["rollbacks"],
    **stats,
    "method_stats": sorted(stats),
    "memory_growth_bytes": summary["memory"]["growth_bytes"],
    "curve": curve,
    "compile_s": summary["compile_s"],
    "train_s": summary["train_s"],
    "workdir": workdir,
  }
