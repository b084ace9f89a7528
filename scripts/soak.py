"""Soak run: a long hybrid training run with frequent checkpoints, watching memory and health.

  .venv/bin/python scripts/soak.py                                  # tiny GPT-2, 5000 steps
  .venv/bin/python scripts/soak.py --steps=1000 --report_every=100 --workdir=runs/soak

It trains the hybrid GPT-2 of `experiments/configs/gpt2_small.py:<preset>` on the bundled corpus
through `loop.train.train`, with a checkpoint every `--checkpoint_every` steps. Every `--report_every`
steps (once the checkpoint save in flight, if any, is written, and after `gc.collect()` and, with
glibc, `malloc_trim(0)`) it reads:

  live_bytes   bytes of the distinct device buffers behind `jax.live_arrays()` (exact, any backend)
  live_arrays  how many such buffers
  rss_bytes    the process resident set size (/proc; noisy: allocator caches, page reuse)
  health       the controller's health events so far (non-finite, gradient explosion, loss spike,
               repeated prediction failure) and the steps skipped as non-finite

At the end it prints a table and writes `<workdir>/soak.json` (readings, growth figures, the run
summary). Flat memory means: live bytes identical at every reading, RSS growth small.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_collections  # noqa: E402

from hybridjax import checkpoint as ckpt_lib  # noqa: E402
from hybridjax import memory as memory_lib  # noqa: E402
from hybridjax import preflight
from hybridjax.loop import train as train_lib  # noqa: E402


def _trim_heap() -> None:
  """Returns freed heap pages to the OS (glibc `malloc_trim`), so RSS counts memory in use, not
  what the allocator kept after the compiles; a no-op where there is no glibc."""
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


def run_soak(
  config: ml_collections.ConfigDict, workdir: str, task: Mapping[str, Any], report_every: int, verbose: bool = False
) -> dict[str, Any]:
  """Trains `config` on `task` (keyword arguments of `loop.train.train`) and measures memory/health.

  Args:
    config: a validated experiment config; `trainer.log_every` is set to `report_every`.
    workdir: the run directory; `soak.json` is written there.
    task: init_params, loss_fn, train_batch, eval_batches (and optionally tokens_per_step, ...).
    report_every: steps between readings.
    verbose: print each reading as it is taken.

  Returns:
    The soak report (also in `<workdir>/soak.json`).
  """
  if report_every < 1:
    raise ValueError(f"--report_every must be >= 1, got {report_every}")
  config = config.copy_and_resolve_references()
  config.trainer.log_every = report_every  # a reading at every log, which is one device read
  readings: list[dict[str, Any]] = []
  t0 = time.perf_counter()
  report: dict[str, Any] = {
    "steps": config.trainer.steps,
    "mode": config.mode,
    "checkpoint_every": config.trainer.checkpoint_every,
    "report_every": report_every,
    "complete": False,
    "readings": readings,
  }
  path = os.path.join(workdir, "soak.json")

  def write() -> None:  # after every reading: a soak that dies still leaves its figures
    os.makedirs(workdir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
      json.dump(report, f, indent=2, default=str)
    os.replace(path + ".tmp", path)

  # An asynchronous save in flight holds a copy of the state on the device until it is written.
  # Readings wait for it, so they count the training loop alone (the copy is transient, by design).
  managers: list[Any] = []
  original_save = ckpt_lib.save

  def save(manager, step, state, meta):
    original_save(manager, step, state, meta)
    managers[:] = [manager]

  def on_log(step: int, record: Mapping[str, Any]) -> None:
    if managers:
      managers[0].wait_until_finished()
    gc.collect()  # orbax saves leave reference cycles; count what is really held
    _trim_heap()
    n_live, live_bytes = memory_lib.live_array_stats()
    r = {
      "step": step,
      "wall_s": round(time.perf_counter() - t0, 2),
      "live_arrays": n_live,
      "live_bytes": live_bytes,
      "rss_bytes": memory_lib.process_rss_bytes(),
      "health_events": int(record.get("health_events", 0)),
      "nonfinite_streak": int(record.get("nonfinite_streak", 0)),
      "loss": float(record["loss"]),
      "phase": int(record.get("phase_now", record.get("phase", 0))),
    }
    readings.append(r)
    if verbose:
      print(
        f"soak step {step}: live {n_live} arrays / {live_bytes} B, RSS "
        f"{memory_lib.format_bytes(r['rss_bytes'])}, health events {r['health_events']}",
        flush=True,
      )
    write()

  ckpt_lib.save = save
  try:
    summary = train_lib.train(config, workdir, hooks={"on_log": on_log}, **task)
  finally:
    ckpt_lib.save = original_save
  report.update(summary=summary, complete=True, **growth_figures(readings))
  write()
  return report


def growth_figures(readings: list[dict[str, Any]]) -> dict[str, Any]:
  """Live-bytes and RSS growth from the second reading to the last. The first `report_every` steps
  include the compiles (whose memory the allocator may return to the OS only later) and the first
  run of every step kind, so the second reading is the reference ('first' below)."""
  if not readings:
    return {}
  first, last = readings[min(1, len(readings) - 1)], readings[-1]
  live = [r["live_bytes"] for r in readings]
  return {
    "live_bytes_first": first["live_bytes"],
    "live_bytes_last": last["live_bytes"],
    "live_bytes_min": min(live),
    "live_bytes_max": max(live),
    "live_bytes_growth": last["live_bytes"] - first["live_bytes"],
    "rss_first": first["rss_bytes"],
    "rss_last": last["rss_bytes"],
    "rss_max": max(r["rss_bytes"] for r in readings),
    "rss_growth": last["rss_bytes"] - first["rss_bytes"],
    "rss_growth_fraction": ((last["rss_bytes"] - first["rss_bytes"]) / max(first["rss_bytes"], 1)),
    "health_events": last["health_events"],
  }


def format_report(report: Mapping[str, Any]) -> str:
  """The readings as a table, then the growth figures and the health events by kind."""
  fb = memory_lib.format_bytes
  lines = [f"{'step':>7} {'wall s':>8} {'live arrays':>11} {'live bytes':>12} {'RSS':>10} {'health':>6} {'loss':>8}"]
  for r in report["readings"]:
    lines.append(
      f"{r['step']:>7} {r['wall_s']:>8.1f} {r['live_arrays']:>11} {r['live_bytes']:>12} "
      f"{fb(r['rss_bytes']):>10} {r['health_events']:>6} {r['loss']:>8.4f}"
    )
  if report["readings"]:
    lines.append(
      f"from the second reading on: live bytes first {report['live_bytes_first']} B, last "
      f"{report['live_bytes_last']} B, growth {report['live_bytes_growth']} B; range over all "
      f"readings [{report['live_bytes_min']}, {report['live_bytes_max']}] B"
    )
    lines.append(
      f"RSS: first {fb(report['rss_first'])}, last {fb(report['rss_last'])}, max "
      f"{fb(report['rss_max'])}, growth {fb(report['rss_growth'])} "
      f"({report['rss_growth_fraction']:+.2%})"
    )
  s = report["summary"]
  if "health_events" in s:
    lines.append(f"health events: {s['health_events']}")
  lines.append(
    f"steps skipped as non-finite: {s.get('nonfinite_skipped', 0)}; rollbacks: "
    f"{s.get('rollbacks', 0)}; predict fraction: {s.get('predict_fraction', 0):.1%}"
  )
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--steps", type=int, default=5000, help="training steps (default 5000)")
  parser.add_argument("--workdir", default="", help="run directory (default runs/soak-<time>)")
  parser.add_argument("--checkpoint_every", type=int, default=100, help="steps between checkpoints (default 100)")
  parser.add_argument("--report_every", type=int, default=250, help="steps between memory readings (default 250)")
  parser.add_argument("--preset", default="tiny", help="GPT-2 preset: tiny (default) or small")
  parser.add_argument("--mode", default="hybrid", choices=("hybrid", "baseline"))
  args = parser.parse_args(argv)

  from experiments import gpt2_small as experiment
  from experiments.configs import gpt2_small as configs

  try:
    config = configs.get_config(args.preset)
    config.mode = args.mode
    config.trainer.steps = args.steps
    config.trainer.checkpoint_every = args.checkpoint_every
    config.trainer.max_to_keep = 2
    config.trainer.eval_every = 0  # eval once at the end: the soak is about the training loop
    config.trainer.progress = False
    preflight.validate(config)
    workdir = args.workdir or os.path.join("runs", f"soak-{args.preset}-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    task = experiment.build_task(config).train_kwargs()
    print(
      f"soak: {args.preset} {args.mode}, {args.steps} steps, checkpoint every "
      f"{args.checkpoint_every}, reading every {args.report_every}, workdir {workdir}",
      flush=True,
    )
    report = run_soak(config, workdir, task, args.report_every, verbose=True)
  except (ValueError, FileNotFoundError, train_lib.TrainingDiverged) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(format_report(report))
  print(f"wrote {os.path.join(workdir, 'soak.json')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
