"""The honest benchmark: baseline vs hybrid vs hybrid with constant alpha = 1, in one process.

  python -m experiments.benchmark                 # tiny GPT-2 on CPU (< 15 minutes)
  python -m experiments.benchmark --quick         # a smoke run of the whole pipeline (< 2 minutes)
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:124m   # on a GPU

Every run uses the same data, seed, batch size, optimizer, step budget and held-out eval batches;
only `config.mode` (and, for the ablation, `hybrid.constant_alpha`) differ. Runs are repeated in
interleaved order (baseline, hybrid, ablation, baseline, ...) and their timings are medians, so a
drift in machine load hits every run alike. Compile time is measured separately and excluded.

Figures (each with the numbers it was computed from), written to `<workdir>/benchmark.json` and as
a markdown table to `<workdir>/results.md`:

  target_eval_loss   the baseline's eval loss at the end of its budget
  backward_ratio     baseline backward passes to the target / the run's (or "not reached")
  wallclock_ratio    baseline training seconds to the target / the run's (or "not reached")
  final_loss_gap     (run's final eval loss - baseline's) / baseline's, at the same step budget
  predict_fraction   predicted steps / all steps
  step_cost          ms per step of each phase, relative to a FULL step
  dynamics_share     the dynamics model's train_step + imagine time / FULL step time
  memory_growth      bytes in use at the end minus after the first step, per run
  switch_overhead    the fused step's extra time per step as a fraction of a FULL step (scripts/bench_switch.py)

A ratio > 1 means hybrid is better. A run that never reaches the target has no ratio: its entry
says "not reached" and gives its best eval loss instead. Nothing here asserts or expects a speedup.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Any

import jax
import ml_collections
from absl import app

from experiments import gpt2_small
from hybridjax import cli, plotting
from hybridjax import config as config_lib
from hybridjax.hybrid import dynamics as dynamics_lib
from hybridjax.hybrid import full_step as full_step_lib
from hybridjax.hybrid import step as step_lib
from hybridjax.loop import drivers
from hybridjax.loop import train as train_lib
from hybridjax.optim import make_optimizer

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "benchmark.py")

RUN_NAMES = ("baseline", "hybrid", "constant_alpha")
NOT_REACHED = "not reached"


# --- running ------------------------------------------------------------------------------------


def run_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """The experiment config of one benchmark run: only the mode and the ablation's alpha differ."""
  c = ml_collections.ConfigDict(config.to_dict())
  del c.benchmark
  c.mode = "baseline" if name == "baseline" else "hybrid"
  c.resume = "never"  # a benchmark run always starts from scratch
  if name == "constant_alpha":
    c.hybrid.constant_alpha = float(config.benchmark.constant_alpha)
  return c


def parse_runs(config: ml_collections.ConfigDict) -> list[str]:
  names = [n.strip() for n in str(config.benchmark.runs).split(",") if n.strip()]
  bad = [n for n in names if n not in RUN_NAMES]
  if bad or "baseline" not in names or len(set(names)) != len(names):
    raise ValueError(
      f"--config.benchmark.runs={config.benchmark.runs!r}: give distinct names from "
      f"{','.join(RUN_NAMES)}, including baseline (the reference)"
    )
  return names


def eval_curve(workdir: str) -> list[dict[str, float]]:
  """[{step, eval_loss, train_s, backward_passes}] at each eval of a run (`plotting.eval_curve`:
  the benchmark logs at every eval step, so train_s and backward_passes are the logged values)."""
  run = plotting.load_run(workdir)
  steps, loss = plotting.eval_curve(run, "step")
  _, train_s = plotting.eval_curve(run, "train_s")
  _, backward = plotting.eval_curve(run, "backward_passes")
  return [
    {"step": int(s), "eval_loss": float(v), "train_s": float(t), "backward_passes": int(round(b))}
    for s, v, t, b in zip(steps, loss, train_s, backward)
  ]


def time_dynamics(config: ml_collections.ConfigDict, task: gpt2_small.Task, calls: int) -> float:
  """Median ms of one dynamics-model update plus imagination, as a real hybrid step runs them.

  Timed alone (jitted, on a state of the run's shapes) because inside the fused real step its cost
  cannot be separated from the forward and backward pass.
  """
  c = run_config(config, "hybrid")
  params = task.init_params(jax.random.PRNGKey(c.seed))
  ctx = drivers.make_context(
    c.hybrid, loss_fn=task.loss_fn, tx=make_optimizer(c.optim), params_shape=params, total_steps=c.trainer.steps
  )
  state = step_lib.init_hybrid_state(ctx, params, jax.random.PRNGKey(0))
  window = full_step_lib.history_window(state.history, ctx.window)

  @jax.jit
  def update_and_imagine(dyn, window, rng):
    r1, r2 = jax.random.split(rng)
    dyn, _ = dynamics_lib.train_step(dyn, window, r1, ctx.rssm)
    return dyn, dynamics_lib.imagine(dyn, window, ctx.hmax, r2, ctx.rssm)

  dyn, rng = state.dynamics, jax.random.PRNGKey(1)
  jax.block_until_ready(update_and_imagine(dyn, window, rng))  # compile
  times = []
  for _ in range(max(calls, 1)):
    t0 = time.perf_counter()
    dyn, out = update_and_imagine(dyn, window, rng)
    jax.block_until_ready(out)
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def switch_overhead(preset: str) -> dict[str, Any]:
  """Runs scripts/bench_switch.py on this preset's model in a fresh process and parses its table."""
  model = "micro" if preset == "quick" else "tiny"
  script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_switch.py")
  cmd = [sys.executable, script, "--model", model, "--repeats", "15"]
  out = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if out.returncode != 0:
    return {"value": None, "error": out.stderr.strip().splitlines()[-1:] or ["failed"], "command": " ".join(cmd[1:])}
  per_phase = {}
  for line in out.stdout.splitlines():
    m = re.match(
      r"^(WARMUP full|FULL full|PREDICT|CORRECT entry)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)$", line.strip()
    )
    if m:
      per_phase[m.group(1)] = {
        "separate_ms": float(m.group(2)),
        "fused_ms": float(m.group(3)),
        "ratio": float(m.group(4)),
        "extra_of_full": float(m.group(5)),
      }
  worst = max((v["extra_of_full"] for v in per_phase.values()), default=None)
  return {
    "value": worst,
    "per_phase": per_phase,
    "model": model,
    "command": "python scripts/bench_switch.py --model " + model + " --repeats 15",
  }


def machine_info() -> dict[str, Any]:
  dev = jax.devices()[0]
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count()
  return {
    "platform": dev.platform,
    "device_kind": dev.device_kind,
    "device_count": jax.device_count(),
    "cpu_cores": cores,
    "python": platform.python_version(),
    "jax": jax.__version__,
    "machine": platform.machine(),
    "node": platform.node(),
    "load_average_1m": os.getloadavg()[0],
  }  # other work on the machine skews the timings


# --- figures ------------------------------------------------------------------------------------


def first_reaching(curve: list[dict[str, float]], target: float) -> dict[str, float] | None:
  """The first eval point at or below `target`, or None."""
  for point in curve:
    if point["eval_loss"] <= target:
      return point
  return None


def _ratio(num: float, den: float) -> float | None:
  return num / den if den > 0 else None


def compute_figures(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """All figures from the raw per-run records (see `summarise_run`); pure, so tests can recompute."""
  base = runs["baseline"]
  target = base["final_eval_loss"]
  base_hit = first_reaching(base["curve"], target)
  figures: dict[str, Any] = {"target_eval_loss": {"value": target, "from": "baseline final_eval_loss"}}
  for name, run in runs.items():
    if name == "baseline":
      continue
    hit = first_reaching(run["curve"], target)
    f: dict[str, Any] = {}
    if hit is None:
      best = min(run["curve"], key=lambda p: p["eval_loss"])
      f["backward_ratio"] = {
        "value": NOT_REACHED,
        "target": target,
        "best_eval_loss": best["eval_loss"],
        "best_at_step": best["step"],
      }
      f["wallclock_ratio"] = dict(f["backward_ratio"])
    else:
      f["backward_ratio"] = {
        "value": _ratio(base_hit["backward_passes"], hit["backward_passes"]),
        "baseline_backward_passes": base_hit["backward_passes"],
        "run_backward_passes": hit["backward_passes"],
        "baseline_step": base_hit["step"],
        "run_step": hit["step"],
        "target": target,
      }
      f["wallclock_ratio"] = {
        "value": _ratio(base_hit["train_s"], hit["train_s"]),
        "baseline_train_s": base_hit["train_s"],
        "run_train_s": hit["train_s"],
        "baseline_step": base_hit["step"],
        "run_step": hit["step"],
        "target": target,
      }
    f["final_loss_gap"] = {
      "value": (run["final_eval_loss"] - target) / target,
      "run_final_eval_loss": run["final_eval_loss"],
      "baseline_final_eval_loss": target,
    }
    total = sum(run["phase_steps"].values())
    f["predict_fraction"] = {
      "value": run["phase_steps"]["PREDICT"] / total if total else 0.0,
      "predict_steps": run["phase_steps"]["PREDICT"],
      "steps": total,
    }
    full_ms = run["phase_ms_per_step"].get("FULL") or run["phase_ms_per_step"].get("WARMUP")
    f["step_cost"] = {
      "value": {p: ms / full_ms for p, ms in run["phase_ms_per_step"].items()},
      "phase_ms_per_step": run["phase_ms_per_step"],
      "baseline_ms_per_step": base["ms_per_step"],
      "reference": "FULL" if run["phase_ms_per_step"].get("FULL") else "WARMUP",
    }
    if "dynamics_ms" in run:
      f["dynamics_share"] = {
        "value": run["dynamics_ms"] / full_ms,
        "dynamics_ms": run["dynamics_ms"],
        "full_ms": full_ms,
      }
    figures[name] = f
  figures["memory_growth"] = {
    "value": {name: max(run["memory_growth_bytes"]) for name, run in runs.items()},
    "per_repeat": {name: run["memory_growth_bytes"] for name, run in runs.items()},
    "source": base["memory_source"],
  }
  return figures


def summarise_run(repeats: list[tuple[dict[str, Any], list[dict[str, float]]]]) -> dict[str, Any]:
  """Raw record of one run over its repeats: the loss curve, median times, counts, memory."""
  summaries = [s for s, _ in repeats]
  curves = [c for _, c in repeats]
  curve = [dict(p) for p in curves[0]]
  for i, p in enumerate(curve):  # losses are deterministic; wall-clock is the median over repeats
    p["train_s"] = statistics.median(c[i]["train_s"] for c in curves)
    p["train_s_repeats"] = [c[i]["train_s"] for c in curves]
  s0 = summaries[0]
  out = {
    "final_eval_loss": float(s0["final_eval_loss"]),
    "curve": curve,
    "losses_identical_across_repeats": all(
      [p["eval_loss"] for p in c] == [p["eval_loss"] for p in curves[0]] for c in curves
    ),
    "train_s": statistics.median(s["train_s"] for s in summaries),
    "ms_per_step": 1e3 * statistics.median(s["s_per_step"] for s in summaries),
    "compile_s": [s["compile_s"] for s in summaries],
    "memory_growth_bytes": [int(s["memory"]["growth_bytes"]) for s in summaries],
    "memory_peak_bytes": [int(s["memory"]["peak_bytes"]) for s in summaries],
    "memory_source": s0["memory"]["source"],
    "workdirs": [s["workdir"] for s in summaries],
  }
  if "phase_steps" in s0:
    out["phase_steps"] = s0["phase_steps"]
    out["backward_passes"] = s0["backward_passes"]
    out["rollbacks"] = s0["rollbacks"]
    out["phase_ms_per_step"] = {
      p: statistics.median(s["phase_ms_per_step"][p] for s in summaries) for p in s0.get("phase_ms_per_step", {})
    }
  else:
    out["backward_passes"] = s0["steps"]
  return out


def _fmt(v: Any) -> str:
  return "n/a" if v is None else train_lib.format_value(v)


def markdown_table(result: dict[str, Any]) -> str:
  """The results table: one column per compared run; every cell says what it is computed from."""
  fig, runs = result["figures"], result["runs"]
  names = [n for n in runs if n != "baseline"]
  head = "| figure | " + " | ".join(names) + " |\n|---|" + "---|" * len(names)
  rows = [head]

  def row(label, cell):
    rows.append(f"| {label} | " + " | ".join(cell(n) for n in names) + " |")

  def ratio_cell(key, num, den):
    def cell(n):
      f = fig[n][key]
      if f["value"] == NOT_REACHED:
        return f"not reached (best {f['best_eval_loss']:.4f})"
      return f"**{f['value']:.2f}×** ({_fmt(f[num])} / {_fmt(f[den])})"

    return cell

  t = fig["target_eval_loss"]["value"]
  row(
    f"backward_ratio to eval {t:.4f}", ratio_cell("backward_ratio", "baseline_backward_passes", "run_backward_passes")
  )
  row("wallclock_ratio (s / s)", ratio_cell("wallclock_ratio", "baseline_train_s", "run_train_s"))
  row(
    "final eval loss (baseline " + f"{t:.4f})",
    lambda n: (
      f"{fig[n]['final_loss_gap']['run_final_eval_loss']:.4f} ({100 * fig[n]['final_loss_gap']['value']:+.2f}%)"
    ),
  )
  row(
    "predict_fraction",
    lambda n: (
      f"{fig[n]['predict_fraction']['value']:.1%} "
      f"({fig[n]['predict_fraction']['predict_steps']}/"
      f"{fig[n]['predict_fraction']['steps']})"
    ),
  )
  row("backward passes", lambda n: str(runs[n]["backward_passes"]))
  row("step_cost vs FULL", lambda n: ", ".join(f"{p} {v:.2f}" for p, v in fig[n]["step_cost"]["value"].items()))
  row(
    "ms per step by phase",
    lambda n: ", ".join(f"{p} {v:.1f}" for p, v in fig[n]["step_cost"]["phase_ms_per_step"].items()),
  )
  if all("dynamics_share" in fig[n] for n in names):
    row(
      "dynamics model share of FULL",
      lambda n: f"{fig[n]['dynamics_share']['value']:.1%} ({fig[n]['dynamics_share']['dynamics_ms']:.1f} ms)",
    )
  row("memory growth (B)", lambda n: str(fig["memory_growth"]["value"][n]))
  b = runs["baseline"]
  lines = [
    "\n".join(rows),
    "",
    f"baseline: final eval loss {b['final_eval_loss']:.4f}, {b['ms_per_step']:.1f} ms/step, "
    f"{b['train_s']:.1f} s training, memory growth {fig['memory_growth']['value']['baseline']} B.",
  ]
  so = result.get("switch_overhead")
  if so and so.get("value") is not None:
    lines.append(
      "switch_overhead (the fused step's extra time per step, as a fraction of a FULL step): "
      + ", ".join(
        f"{p} {v['extra_of_full']:+.3f} (fused/separate {v['ratio']:.3f})" for p, v in so["per_phase"].items()
      )
      + f"; max {so['value']:.3f}"
    )
  m = result["machine"]
  lines.append(
    f"machine: {m['platform']} ({m['device_kind']}), {m['cpu_cores']} CPU cores, "
    f"jax {m['jax']}, load average {m['load_average_1m']:.1f} at start and "
    f"{m.get('load_average_1m_end', float('nan')):.1f} at end; repeats "
    f"{result['repeats']} (times are medians)."
  )
  return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------


def run_benchmark(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every configured run (interleaved repeats), computes the figures, writes the outputs."""
  names = parse_runs(config)
  b = config.benchmark
  if int(b.repeats) < 1:
    raise ValueError(f"--config.benchmark.repeats={b.repeats}: must be >= 1")
  if os.path.exists(os.path.join(workdir, "benchmark.json")) or any(
    os.path.exists(os.path.join(workdir, n)) for n in names
  ):
    raise ValueError(
      f"--workdir {workdir} already holds benchmark runs; a benchmark always starts from scratch: use a new --workdir"
    )
  for n in names:
    config_lib.validate(run_config(config, n))
  os.makedirs(workdir, exist_ok=True)
  task = gpt2_small.build_task(run_config(config, "baseline"))
  t_start = time.perf_counter()

  raw: dict[str, list] = {n: [] for n in names}
  for rep in range(int(b.repeats)):
    for name in names:
      wd = os.path.join(workdir, name if rep == 0 else os.path.join("repeats", f"{name}-{rep}"))
      print(f"\n=== {name} (repeat {rep + 1}/{b.repeats}) -> {wd}", flush=True)
      kwargs = task.train_kwargs()
      kwargs["extra_meta"] = dict(task.extra_meta, benchmark_run=name)
      summary = train_lib.train(run_config(config, name), wd, **kwargs)
      summary["workdir"] = wd
      raw[name].append((summary, eval_curve(wd)))

  runs = {n: summarise_run(raw[n]) for n in names}
  if any(n != "baseline" for n in names):
    dyn_ms = time_dynamics(config, task, int(b.dynamics_timing_calls))
    for n in names:
      if n != "baseline":
        runs[n]["dynamics_ms"] = dyn_ms
  result: dict[str, Any] = {
    "preset": b.preset,
    "repeats": int(b.repeats),
    "machine": machine_info(),
    "config": json.loads(config.to_json()),
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "runs": runs,
  }
  result["figures"] = compute_figures(runs)
  if b.switch_overhead:
    print("\n=== switch overhead (scripts/bench_switch.py)", flush=True)
    result["switch_overhead"] = switch_overhead(b.preset)
    result["figures"]["switch_overhead"] = result["switch_overhead"]
  result["wall_s"] = time.perf_counter() - t_start
  result["machine"]["load_average_1m_end"] = os.getloadavg()[0]

  table = markdown_table(result)
  with open(os.path.join(workdir, "benchmark.json"), "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(table + "\n")
  result["plots"] = save_plots(workdir, names)
  print("\n" + table)
  print(
    f"\nbenchmark wall time {result['wall_s']:.0f} s; outputs in {workdir}: benchmark.json, "
    f"results.md, " + ", ".join(os.path.basename(p) for p in result["plots"])
  )
  return result


def save_plots(workdir: str, names: list[str]) -> list[str]:
  """Comparison curves for all runs, plus the hybrid run's own figures (hybridjax.plotting)."""
  loaded = {n: plotting.load_run(os.path.join(workdir, n)) for n in names}
  paths = list(plotting.save_comparison_figures(loaded, workdir))
  if "hybrid" in names:
    paths += plotting.save_run_figures(os.path.join(workdir, "hybrid"), os.path.join(workdir, "hybrid_figures"))
  return paths


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _FLAGS[0].value
  cli.run_as_program(lambda: run_benchmark(config, _FLAGS[1].value or cli.default_workdir(config, kind="benchmark")))


def _expand_quick(argv: list[str]) -> list[str]:
  """`--quick` is short for `--config=experiments/configs/benchmark.py:quick`."""
  if "--quick" not in argv:
    return argv
  if any(a.startswith("--config=") or a == "--config" for a in argv):
    sys.exit("error: pass either --quick or --config=..., not both")
  return [f"--config={_CONFIG_PATH}:quick" if a == "--quick" else a for a in argv]


if __name__ == "__main__":
  # Rewritten before the flags exist: config_flags also reads sys.argv for `--config.*` overrides.
  sys.argv = _expand_quick(sys.argv)
  _FLAGS = cli.define_flags(
    _CONFIG_PATH + ":tiny", "Output folder (default: runs/<preset>-benchmark-<time>); must not hold a benchmark yet."
  )
  app.run(main)
