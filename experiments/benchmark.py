"""The benchmark protocol: hybrid training against tuned anchors on a budget curve.

  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long        # AdamW-cosine
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long,muon   # Muon-cosine
  python -m experiments.benchmark --quick                                                # smoke run

What it does, for one (optimizer, schedule) family:

1. LR sweep, on the first tuning seed at the full budget N: a sqrt(2) grid around the config's LR,
   extended while the best sits at an edge. The best two are re-run on the second tuning seed; the
   better mean wins. The winner and its sqrt(2) neighbours are checked at 0.5N and 2N; where another
   LR wins there by more than the seed noise, the budgets near it use that LR.
2. Averaging beta, from the same runs: every tuning run also keeps the params' moving average at each
   beta of `benchmark.betas`; the beta with the best mean averaged loss at the chosen LR wins.
3. Budget curve, on each headline seed: budgets B x N, each with its own warm-up and schedule of length
   B, each reporting the final eval loss of its raw and its averaged params. Those are the two anchors.
4. Method arms (hybrid training and its ablations) at the tuned LR and beta on each headline seed,
   through the library's own `train()`; their model is the averaged params, as the averaged anchor's.
5. Timing: each arm's median time per step of each kind (a baseline step; a hybrid FULL, PREDICT,
   validated PREDICT or CORRECT step), measured interleaved in this process after every run is done.
6. Figures per seed against each anchor (`hybridjax.protocol`): backward_ratio (baseline steps needed
   to reach the method's final loss, read off the monotone budget curve interpolated in log budget,
   over the method's backward passes), pass_ratio (validation forwards counted as 1/3 of a step),
   wallclock_ratio (from the median step times), final-loss gaps and paired differences. Means and
   standard deviations over seeds; a difference under 2 standard errors is "no difference".

Every run is cached in `<workdir>/cache` under a hash of its config and of the code, so re-running
with another method reuses the sweep and the curves; timing is always measured afresh. Outputs:
`benchmark.json` (every figure with its raw numbers), `headline.json`, `results.md` and plots.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import datetime
import hashlib
import inspect
import json
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import app

from experiments import gpt2_small
from hybridjax import cli, plotting, protocol, writers
from hybridjax import config as config_lib
from hybridjax import optim as optim_lib
from hybridjax.hybrid.phases import BRANCH_NAMES, Branch
from hybridjax.loop import train as train_lib

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "benchmark.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

METHODS = (
  "hybrid",
  "constant_alpha",
  "no_corrector",
  "outer_momentum",
  "jump",
  "skip_control",
  "jump_outer",
  "skip_control_outer",
  "jump_forecast",
  "skip_control_forecast",
)
# hybrid.predictor='jump'; a skip control moves no weight; '_outer': with outer momentum, whose m
# gives the drift; '_forecast': with the RSSM forecaster (hybrid.jump.forecast='rssm').
JUMP_METHODS = ("jump", "skip_control", "jump_outer", "skip_control_outer", "jump_forecast", "skip_control_forecast")
JUMP_STEP = "jump_step"  # the jump predictor's PREDICT step: probe forwards, then a move or nothing
REAL_STEP = "real_step"  # the one step kind of a method arm that trains in baseline mode
SNAPSHOT_STEP = "full_step+snapshot"  # a forecaster's real step that also snapshots and trains the RSSM
ANCHORS = ("baseline", "averaged_baseline")  # the raw and the averaged budget curve
PREDICT_VALIDATED = "predict_step+validation"
FORWARD_COST = 1.0 / 3.0  # a forward pass as a fraction of a training step (forward + backward)


# --- configs and the run cache ------------------------------------------------------------------


def experiment_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The experiment part of a benchmark config (without the `benchmark` block)."""
  c = ml_collections.ConfigDict(config.to_dict())
  del c.benchmark
  c.mode = "baseline"  # each run sets its own
  return c


def parse_methods(config: ml_collections.ConfigDict) -> list[str]:
  names = [n.strip() for n in str(config.benchmark.methods).split(",") if n.strip()]
  bad = [n for n in names if n not in METHODS]
  if bad or len(set(names)) != len(names):
    raise ValueError(
      f"--config.benchmark.methods={config.benchmark.methods!r}: give distinct names from {','.join(METHODS)} "
      "(or '' for the anchors only)"
    )
  return names


def validate_benchmark(config: ml_collections.ConfigDict) -> None:
  """Checks the benchmark block; errors name the field and the fix."""
  b = config.benchmark
  errors = []
  if len(b.tuning_seeds) != 2:
    errors.append(f"benchmark.tuning_seeds must hold 2 seeds, got {tuple(b.tuning_seeds)}")
  if len(b.seeds) < 2:
    errors.append(f"benchmark.seeds needs at least 2 headline seeds (3 or more for a headline), got {tuple(b.seeds)}")
  if set(b.seeds) & set(b.tuning_seeds):
    errors.append("benchmark.seeds and benchmark.tuning_seeds must not share a seed: headline seeds never tune")
  if 1.0 not in tuple(b.budgets) or any(f <= 0 for f in b.budgets) or len(set(b.budgets)) != len(b.budgets):
    errors.append(f"benchmark.budgets must be distinct positive factors of N including 1.0, got {tuple(b.budgets)}")
  if int(b.lr_points) < 3:
    errors.append(f"benchmark.lr_points must be >= 3, got {b.lr_points}")
  if not b.betas or any(not 0 < x < 1 for x in b.betas):
    errors.append(f"benchmark.betas must be averaging betas in (0, 1), got {tuple(b.betas)}")
  if int(b.workers) < 1:
    errors.append(f"benchmark.workers must be >= 1, got {b.workers}")
  if int(b.eval_points) < 1 or int(b.timing_rounds) < 1 or int(b.timing_steps) < 1:
    errors.append("benchmark.eval_points, timing_rounds and timing_steps must be >= 1")
  if config.trainer.averaging != "ema":
    errors.append("the benchmark compares averaged anchors: keep --config.trainer.averaging=ema")
  if errors:
    raise ValueError("; ".join(errors))
  parse_methods(config)
  config_lib.validate(experiment_config(config))


# The source an anchor run depends on: a change to the hybrid algorithm leaves the cached anchors valid.
_ANCHOR_SOURCES = (
  "hybridjax/optim.py",
  "hybridjax/models/gpt2.py",
  "hybridjax/data.py",
  "experiments/gpt2_small.py",
)


def code_version(kind: str = "method") -> str:
  """A hash of the source a run of `kind` depends on: a cached run is reused only by the same code.

  A method run depends on everything in `hybridjax/` and `experiments/`; an anchor run on the
  optimizer, model, data and evaluation code and on this module's anchor runner.
  """
  h = hashlib.sha256()
  if kind == "anchor":
    paths = [os.path.join(_ROOT, p) for p in _ANCHOR_SOURCES]
    # The runner and the loop's evaluation functions it calls; what a run trains is in its spec.
    for fn in (
      run_anchor,
      _anchor_programs,
      _eval,
      _finite,
      train_lib.make_eval_fn,
      train_lib.eval_losses,
      train_lib.evaluate,
    ):
      h.update(inspect.getsource(fn).encode())
  else:
    paths = [
      os.path.join(dirpath, name)
      for top in ("hybridjax", "experiments")
      for dirpath, _, filenames in os.walk(os.path.join(_ROOT, top))
      for name in filenames
      if name.endswith(".py")
    ]
  for path in sorted(paths):
    h.update(os.path.relpath(path, _ROOT).encode())
    with open(path, "rb") as f:
      h.update(f.read())
  import flax
  import jaxlib
  import optax

  h.update(
    f"jax {jax.__version__} jaxlib {jaxlib.__version__} optax {optax.__version__} flax {flax.__version__}".encode()
  )
  return h.hexdigest()[:16]


def run_key(spec: dict[str, Any], version: str) -> str:
  return hashlib.sha256((json.dumps(spec, sort_keys=True) + version).encode()).hexdigest()[:20]


def run_spec(
  config: ml_collections.ConfigDict,
  *,
  kind: str,
  seed: int,
  lr: float,
  steps: int,
  beta: float,
  betas: Sequence[float] = (),
  method: str = "",
) -> dict[str, Any]:
  """One run, as plain data: what it trains (the whole experiment config) and what it records.

  Runs of N steps (anchors and methods) are evaluated `benchmark.eval_points` times, for the eval
  curves and the mid-run check; other budgets only at their end.
  """
  c = experiment_config(config)
  c.seed = int(seed)
  c.optim.learning_rate = float(lr)
  c.trainer.steps = int(steps)
  c.trainer.averaging_beta = float(beta)
  points = int(config.benchmark.eval_points) if int(steps) == int(config.trainer.steps) else 1
  c.trainer.eval_every = max(int(steps) // points, 1)
  c.trainer.log_every = c.trainer.eval_every
  for field in ("compile_cache", "compile_cache_dir", "progress"):  # how, not what: not in the key
    del c.trainer[field]
  if kind == "method" and method in ("outer_momentum", "jump_outer", "skip_control_outer"):
    every, eta, mu = config.benchmark.outer_momentum
    c.optim.update(outer_every=int(every), outer_eta=float(eta), outer_mu=float(mu))
  if kind == "method" and method == "outer_momentum":  # real steps only: the baseline loop's step
    c.mode = "baseline"
  elif kind == "method":
    c.mode = "hybrid"
    if method in JUMP_METHODS:
      c.hybrid.method = "jump"
      c.hybrid.jump.skip_control = method.startswith("skip_control")
      ratio = float(config.benchmark.get("jump_slow_lag_ratio", 0.0))
      if ratio > 0:  # the slow EMA keeps its lag ratio to the averaging EMA the tuning chose
        c.hybrid.jump.slow_beta = 1.0 - (1.0 - float(beta)) / ratio
      if method.endswith("_forecast"):
        c.hybrid.jump.forecast = "rssm"
    elif method == "constant_alpha":
      c.hybrid.velocity.constant_alpha = 1.0
    elif method == "no_corrector":
      c.hybrid.velocity.corrector.enabled = False
  else:
    c.mode = "baseline"
    del c.hybrid  # an anchor trains no hybrid part: its settings are not part of what it is
  return {"kind": kind, "method": method, "config": c.to_dict(), "betas": [float(x) for x in betas]}


# --- the runs (each in a worker process, or in this one) ----------------------------------------

_PROGRAMS: dict[str, Any] = {}  # this process's compiled anchor programs, by model/optimizer config


@dataclasses.dataclass
class _AnchorPrograms:
  tx: Any
  step: Any
  average: Any
  eval_fn: Any


def _anchor_programs(c: ml_collections.ConfigDict, loss_fn: Any) -> _AnchorPrograms:
  """One compiled step per family: the LR and the schedule's length are runtime values."""
  flat = config_lib.flatten(c)
  key = json.dumps(
    {k: v for k, v in flat.items() if k.startswith(("model.", "optim.")) and k != "optim.learning_rate"}
    | {"grad_accum": flat["trainer.grad_accum"]},
    sort_keys=True,
    default=str,
  )
  if key not in _PROGRAMS:
    tx = optim_lib.make_optimizer(c.optim)
    grad_accum = c.trainer.grad_accum
    # The same function, jitted the same way, as `loop.drivers.BaselineDriver`: an anchor run
    # computes the bits `train()` computes (tests/test_benchmark.py checks it).
    step = jax.jit(
      lambda s, b, sch: optim_lib.train_step(s, b, sch, loss_fn=loss_fn, tx=tx, grad_accum=grad_accum),
      donate_argnums=0,
      keep_unused=True,
    )
    average = jax.jit(
      lambda avgs, params, count: [optim_lib.update_average(a, params, count) for a in avgs], donate_argnums=0
    )
    _PROGRAMS[key] = _AnchorPrograms(tx=tx, step=step, average=average, eval_fn=train_lib.make_eval_fn(loss_fn))
  return _PROGRAMS[key]


def run_anchor(spec: dict[str, Any]) -> dict[str, Any]:
  """A baseline run with its averaged params (and, on tuning seeds, the averages at other betas).

  The train state carries the average at `trainer.averaging_beta`, exactly as `train()` does; the
  other betas' averages are side buffers of this function, updated after each step.
  """
  c = ml_collections.ConfigDict(spec["config"])
  task = gpt2_small.build_task(c)
  progs = _anchor_programs(c, task.loss_fn)
  params_rng, _ = jax.random.split(jax.random.PRNGKey(c.seed))  # as `loop.train.make_driver`
  state = optim_lib.init_train_state(task.init_params(params_rng), progs.tx, c.trainer.averaging_beta)
  extra_betas = [b for b in spec["betas"] if b != c.trainer.averaging_beta]
  extras = [
    optim_lib.Averaging(params=jax.tree.map(lambda p: p.copy(), state.params), beta=jax.numpy.float32(b))
    for b in extra_betas
  ]
  schedule = optim_lib.make_schedule(c.optim, c.trainer.steps)
  steps, every = c.trainer.steps, c.trainer.eval_every
  curve, compile_s, train_s = [], 0.0, 0.0
  finals: dict[str, Any] = {}
  t0 = time.perf_counter()
  for i in range(steps):
    state, _ = progs.step(state, task.train_batch(i), schedule)
    if extras:
      extras = progs.average(extras, state.params, i + 1)
    if i == 0:  # the first step compiles
      jax.block_until_ready((state, extras))
      compile_s, t0 = time.perf_counter() - t0, time.perf_counter()
    done = i + 1
    if done % every == 0 or done == steps:
      jax.block_until_ready((state, extras))
      train_s += time.perf_counter() - t0  # training time between evals; evals are not counted
      averaged_losses = train_lib.eval_losses(progs.eval_fn, state.averaging.params, task.eval_batches)
      point = {
        "step": done,
        "eval_loss_raw": _eval(progs.eval_fn, state.params, task.eval_batches),
        "eval_loss_averaged": _finite(float(np.mean(averaged_losses))),  # = train_lib.evaluate
      }
      curve.append(point)
      if done == steps:
        per_batch = [float(x) for x in averaged_losses]
        finals = {
          "raw": point["eval_loss_raw"],
          "averaged": {str(c.trainer.averaging_beta): point["eval_loss_averaged"]},
          "eval_batch_std": float(np.std(per_batch, ddof=1)) if len(per_batch) > 1 else 0.0,
          "per_batch": per_batch,
        }
        for b, a in zip(extra_betas, extras):
          finals["averaged"][str(b)] = _eval(progs.eval_fn, a.params, task.eval_batches)
      t0 = time.perf_counter()
  return {
    "kind": "anchor",
    "seed": int(c.seed),
    "lr": float(c.optim.learning_rate),
    "steps": steps,
    "beta": float(c.trainer.averaging_beta),
    "final_raw": finals["raw"],
    "final_averaged": finals["averaged"],
    "eval_batch_std": finals["eval_batch_std"],
    "final_averaged_per_batch": finals["per_batch"],  # for the eval set's paired sampling error
    "eval_batches": len(task.eval_batches),
    "nonfinite_skipped": int(state.nonfinite_total),
    "curve": curve,
    "compile_s": compile_s,
    "train_s": train_s,
  }


def _eval(eval_fn: Any, params: Any, batches: list[Any]) -> float:
  """`train_lib.evaluate`, with a non-finite mean reported as inf (a diverged run loses every ranking)."""
  return _finite(train_lib.evaluate(eval_fn, params, batches))


def _finite(value: float) -> float:
  return value if math.isfinite(value) else math.inf


def run_method(spec: dict[str, Any], workdir: str, compile_cache_dir: str | None = None) -> dict[str, Any]:
  """A hybrid (or baseline-mode) arm through the library's `train()`: an interrupted run continues from its
  last checkpoint, or starts again when it has none."""
  c = ml_collections.ConfigDict(spec["config"])
  c.trainer.progress = False
  c.trainer.compile_cache = compile_cache_dir is not None
  c.trainer.compile_cache_dir = compile_cache_dir or ""
  task = gpt2_small.build_task(c)
  checkpoints = os.path.join(workdir, "checkpoints")
  if os.path.isdir(workdir) and not (os.path.isdir(checkpoints) and os.listdir(checkpoints)):
    # An interrupted run with no checkpoint starts again from step 0: its old records would be
    # counted twice (the metrics file is appended to).
    shutil.rmtree(workdir)
  summary = train_lib.train(c, workdir, **task.train_kwargs())
  records = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  curve = [
    {"step": r["step"], "eval_loss_raw": r["eval_loss_raw"], "eval_loss_averaged": r["eval_loss_averaged"]}
    for r in records
    if r["kind"] == "eval"
  ]
  predictor = c.hybrid.get("method", "velocity")
  kinds = dict(
    collections.Counter(
      step_kind(r["branch"], r["measured"], predictor, r.get("snapshot", False)) for r in records if r["kind"] == "step"
    )
  )
  if c.mode == "baseline":  # every step a real one, no validation
    summary.update(backward_passes=c.trainer.steps, validation_forwards=0, phase_steps={c.mode: c.trainer.steps})
    summary.update(rollbacks=0)
    kinds = {REAL_STEP: c.trainer.steps}
  if sum(kinds.values()) != sum(summary["phase_steps"].values()):  # a jump is one step of k schedule steps
    raise RuntimeError(f"{workdir}: {sum(kinds.values())} step records for {summary['phase_steps']} steps")
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
    **{k: summary[k] for k in ("jumps", "jump_attempts", "jump_steps", "mean_persisting_gain") if k in summary},
    "memory_growth_bytes": summary["memory"]["growth_bytes"],
    "curve": curve,
    "compile_s": summary["compile_s"],
    "train_s": summary["train_s"],
    "workdir": workdir,
  }


def step_kind(branch: int, measured: bool, predictor: str = "velocity", snapshot: bool = False) -> str:
  """A hybrid step's cost class: its transition, for a predicted step whether it validated, a
  jump (the jump predictor's PREDICT step) as its own kind, and a real step that took the
  forecaster's snapshot as its own (rare and dearer: a median over all real steps would hide it)."""
  name = BRANCH_NAMES[int(branch)]
  if snapshot:
    return SNAPSHOT_STEP
  if int(branch) == Branch.PREDICT_STEP and predictor == "jump":
    return JUMP_STEP
  return PREDICT_VALIDATED if int(branch) == Branch.PREDICT_STEP and measured else name


def execute(spec: dict[str, Any], workdir: str, compile_cache_dir: str | None = None) -> dict[str, Any]:
  """Runs one spec (a worker process's entry point)."""
  if spec["kind"] == "anchor":
    return run_anchor(spec)
  return run_method(spec, workdir, compile_cache_dir)


def _init_worker(counter: Any, cores: list[int], cache_dir: str | None) -> None:
  """A worker: one CPU core and one XLA thread (small models are overhead-bound; two single-thread
  processes get more steps per second from 2 cores than one two-thread process)."""
  with counter.get_lock():
    index = counter.value
    counter.value += 1
  if cores and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {cores[index % len(cores)]})
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
  _enable_cache(cache_dir)


def _enable_cache(cache_dir: str | None) -> None:
  if cache_dir is not None:
    train_lib.enable_compile_cache(ml_collections.ConfigDict({"compile_cache": True, "compile_cache_dir": cache_dir}))


class Runner:
  """Runs specs once: cached results by key, the rest in `workers` processes (or in this one)."""

  def __init__(self, workdir: str, workers: int, compile_cache_dir: str | None):
    self.cache_dir = os.path.join(workdir, "cache")
    self.jax_cache = compile_cache_dir
    os.makedirs(self.cache_dir, exist_ok=True)
    self.versions = {kind: code_version(kind) for kind in ("anchor", "method")}
    self.workers = workers
    self._trained: set[str] = set()  # runs trained by this benchmark
    self._reused: set[str] = set()  # runs found in the cache from an earlier benchmark
    self._pool: concurrent.futures.ProcessPoolExecutor | None = None

  @property
  def ran(self) -> int:
    return len(self._trained)

  @property
  def reused(self) -> int:
    return len(self._reused)

  def close(self, cancel: bool = False) -> None:
    """Stops the worker processes (they live across `run` calls: each compiles its programs once);
    `cancel`: drop the runs still queued (after a failure)."""
    if self._pool is not None:
      self._pool.shutdown(cancel_futures=cancel)
      self._pool = None

  def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor:
    if self._pool is None:
      ctx = multiprocessing.get_context("spawn")
      counter = ctx.Value("i", 0)
      cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
      self._pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=self.workers, mp_context=ctx, initializer=_init_worker, initargs=(counter, cores, self.jax_cache)
      )
    return self._pool

  def _path(self, key: str) -> str:
    return os.path.join(self.cache_dir, key + ".json")

  def run(self, specs: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    keys = [run_key(s, self.versions[s["kind"]]) for s in specs]
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for key, spec in zip(keys, specs):
      if key in results:
        continue
      if os.path.exists(self._path(key)):
        with open(self._path(key)) as f:
          results[key] = json.load(f)
        if key not in self._trained:
          self._reused.add(key)
      else:
        todo.append((key, spec))
        results[key] = None
    print(f"--- {label}: {len(specs)} runs, {len(todo)} to train, {len(specs) - len(todo)} cached", flush=True)
    t0 = time.perf_counter()

    def finish(key: str, result: dict[str, Any]) -> None:
      result["key"] = key
      with open(self._path(key) + ".tmp", "w") as f:
        json.dump(result, f)
      os.replace(self._path(key) + ".tmp", self._path(key))
      results[key] = result
      self._trained.add(key)
      what = f"{result['kind']} {result.get('method') or ''} seed {result['seed']} lr {result['lr']:.3g} "
      print(f"    done {what}steps {result['steps']} ({time.perf_counter() - t0:.0f} s)", flush=True)

    if self.workers <= 1:
      _enable_cache(self.jax_cache)
      for key, spec in todo:
        finish(key, execute(spec, os.path.join(self.cache_dir, "runs", key), self.jax_cache))
    elif todo:
      pool = self._get_pool()
      # Longest first (method runs first among equals: they compile more), so the last runs to
      # finish are short ones and no worker waits long for the other.
      order = sorted(todo, key=lambda kv: (-kv[1]["config"]["trainer"]["steps"], kv[1]["kind"] != "method"))
      futures = {
        pool.submit(execute, spec, os.path.join(self.cache_dir, "runs", key), self.jax_cache): key
        for key, spec in order
      }
      for fut in concurrent.futures.as_completed(futures):
        finish(futures[fut], fut.result())
    return [results[k] for k in keys]


# --- the protocol -------------------------------------------------------------------------------


def lr_grid(center: float, points: int) -> list[float]:
  """`points` learning rates on a sqrt(2) grid centred on `center`."""
  lo = -(points // 2)
  return [_round_lr(center * math.sqrt(2) ** (lo + i)) for i in range(points)]


def _round_lr(lr: float) -> float:
  return float(f"{lr:.4g}")


def _averaged(result: dict[str, Any], beta: float | None = None) -> float:
  """A tuning run's best averaged loss over its betas, or its loss at `beta`."""
  if beta is None:
    return min(result["final_averaged"].values())
  return result["final_averaged"][str(float(beta))]


def tune(
  config: ml_collections.ConfigDict,
  runner: Runner,
  also: Callable[[float, float], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
  """The LR sweep, the second-seed check, the averaging beta and the budget checks.

  `also(best_lr, beta)`: runs to train together with the budget checks, once the LR and beta are
  known (the benchmark passes the budget curves at the chosen LR and the method arms, so the worker
  processes never wait for the checks; a budget whose LR the checks move is trained afterwards).
  """
  b = config.benchmark
  n = int(config.trainer.steps)
  t1, t2 = (int(s) for s in b.tuning_seeds)
  betas = [float(x) for x in b.betas]
  beta0 = betas[0]

  def spec(seed, lr, steps):
    return run_spec(config, kind="anchor", seed=seed, lr=lr, steps=steps, beta=beta0, betas=betas)

  # 1. The sweep on the first tuning seed at N; extended while the best is at an edge. LRs are
  # ranked by the averaged loss (the best over the betas): the headline anchor averages.
  grid = lr_grid(float(config.optim.learning_rate), int(b.lr_points))
  sweep = runner.run([spec(t1, lr, n) for lr in grid], "LR sweep (tuning seed 1, N)")
  for _ in range(int(b.lr_max_extensions)):
    best = min(range(len(grid)), key=lambda i: _averaged(sweep[i]))
    if 0 < best < len(grid) - 1:
      break
    new = _round_lr(grid[0] / math.sqrt(2) if best == 0 else grid[-1] * math.sqrt(2))
    result = runner.run([spec(t1, new, n)], "LR sweep: the best LR is at the grid's edge; extending")[0]
    grid, sweep = ([new] + grid, [result] + sweep) if best == 0 else (grid + [new], sweep + [result])
  ranked = sorted(range(len(grid)), key=lambda i: _averaged(sweep[i]))
  best_at_edge = ranked[0] in (0, len(grid) - 1)
  if best_at_edge:
    print(
      f"WARNING: the best LR {grid[ranked[0]]:.4g} is still at the grid's edge after "
      f"{b.lr_max_extensions} extensions; raise --config.benchmark.lr_max_extensions or move "
      "--config.optim.learning_rate towards it",
      flush=True,
    )
  top2 = [grid[i] for i in ranked[:2]]
  # 2. The best two on the second tuning seed; the better mean over both seeds wins.
  second = runner.run([spec(t2, lr, n) for lr in top2], "LR check (tuning seed 2, N)")
  means = {lr: (_averaged(sweep[grid.index(lr)]) + _averaged(r)) / 2 for lr, r in zip(top2, second)}
  best_lr = min(means, key=means.get)
  # 3. The averaging beta: the best mean over both tuning seeds at the chosen LR.
  at_best = [sweep[grid.index(best_lr)], second[top2.index(best_lr)]]
  beta_table = {str(x): [_averaged(r, x) for r in at_best] for x in betas}
  beta = min(betas, key=lambda x: statistics.fmean(beta_table[str(x)]))
  # The noise of one final loss: the two tuning seeds' spread at the chosen LR and beta, and never
  # less than the eval set's sampling error (two seeds can agree by chance).
  sampling = max(r["eval_batch_std"] / math.sqrt(r["eval_batches"]) for r in at_best)
  noise = max(abs(beta_table[str(beta)][0] - beta_table[str(beta)][1]) / math.sqrt(2), sampling)
  # 4. The best LR and its neighbours at 0.5N and 2N (first tuning seed).
  checks: dict[str, Any] = {}
  per_budget_lr = {str(float(f)): best_lr for f in b.budgets}  # keys: '0.5', '1.0', ...
  neighbours = [_round_lr(best_lr / math.sqrt(2)), best_lr, _round_lr(best_lr * math.sqrt(2))]
  check_specs = [spec(t1, lr, round(factor * n)) for factor in (0.5, 2.0) for lr in neighbours]
  checked = runner.run(
    check_specs + (also(best_lr, beta) if also else []), "LR checks at 0.5N and 2N, and the runs at the chosen LR"
  )
  for k, factor in enumerate((0.5, 2.0)):
    lrs = neighbours
    res = checked[k * len(lrs) : (k + 1) * len(lrs)]
    losses = {lr: _averaged(r, beta) for lr, r in zip(lrs, res)}
    winner = min(losses, key=losses.get)
    moved = winner != best_lr and losses[best_lr] - losses[winner] > 2 * noise
    checks[str(factor)] = {
      "lrs": lrs,
      "averaged_loss": [losses[lr] for lr in lrs],
      "raw_loss": [r["final_raw"] for r in res],
      "winner": winner,
      "wins_beyond_noise": moved,
    }
    if moved:  # this budget and its neighbour on the same side of N use the winner
      for f in b.budgets:
        if (factor < 1 and f <= 0.75) or (factor > 1 and f >= 1.5):
          per_budget_lr[str(float(f))] = winner
  all_runs = sweep + second  # the budget checks' runs are in `checks`
  rows = [
    {
      "lr": r["lr"],
      "seed": r["seed"],
      "budget": r["steps"],
      "loss_raw": r["final_raw"],
      "loss_averaged": _averaged(r, beta),
      "loss_averaged_by_beta": r["final_averaged"],
    }
    for r in all_runs
  ]
  for factor, chk in checks.items():
    for lr, avg, raw in zip(chk["lrs"], chk["averaged_loss"], chk["raw_loss"]):
      rows.append({"lr": lr, "seed": t1, "budget": round(float(factor) * n), "loss_raw": raw, "loss_averaged": avg})
  raw_best_lr = min(grid, key=lambda lr: sweep[grid.index(lr)]["final_raw"])
  return {
    "grid": grid,
    "rows": rows,
    "best_two": top2,
    "best_two_means": {str(k): v for k, v in means.items()},
    "best_lr": best_lr,
    "best_lr_for_raw_loss": raw_best_lr,
    "best_at_edge": best_at_edge,
    "averaging_beta": beta,
    "beta_table": beta_table,
    "seed_noise": noise,
    "budget_checks": checks,
    "per_budget_lr": per_budget_lr,
  }


def curve_specs(config: ml_collections.ConfigDict, lr_of: Callable[[float], float], beta: float) -> list[dict]:
  """The budget curves' runs: every headline seed at every budget factor f, at LR `lr_of(f)`."""
  n = int(config.trainer.steps)
  return [
    run_spec(config, kind="anchor", seed=int(s), lr=lr_of(float(f)), steps=round(float(f) * n), beta=beta)
    for s in config.benchmark.seeds
    for f in sorted(config.benchmark.budgets)
  ]


def budget_curves(config: ml_collections.ConfigDict, runner: Runner, tuning: dict[str, Any]) -> dict[str, Any]:
  """The raw and averaged anchors: every headline seed at every budget, each its own schedule."""
  n = int(config.trainer.steps)
  b = config.benchmark
  factors = [float(f) for f in sorted(b.budgets)]
  specs = curve_specs(config, lambda f: tuning["per_budget_lr"][str(float(f))], tuning["averaging_beta"])
  results = runner.run(specs, "budget curves (headline seeds)")
  budgets = [round(f * n) for f in factors]
  curves: dict[str, dict[str, list[float]]] = {"baseline": {}, "averaged_baseline": {}}
  runs = {}
  for r in results:
    s = str(r["seed"])
    curves["baseline"].setdefault(s, [None] * len(budgets))[budgets.index(r["steps"])] = r["final_raw"]
    curves["averaged_baseline"].setdefault(s, [None] * len(budgets))[budgets.index(r["steps"])] = _averaged(
      r, tuning["averaging_beta"]
    )
    runs[f"{s}/{r['steps']}"] = r
  return {"factors": factors, "budgets": budgets, "curves": curves, "runs": runs}


def method_specs(config: ml_collections.ConfigDict, methods: list[str], lr: float, beta: float) -> list[dict]:
  """Every method arm on every headline seed, N steps at the chosen LR and beta."""
  n = int(config.trainer.steps)
  return [
    run_spec(config, kind="method", seed=int(s), lr=lr, steps=n, beta=beta, method=m)
    for m in methods
    for s in config.benchmark.seeds
  ]


def method_runs(
  config: ml_collections.ConfigDict, runner: Runner, tuning: dict[str, Any], methods: list[str]
) -> dict[str, dict[str, Any]]:
  specs = method_specs(config, methods, tuning["best_lr"], tuning["averaging_beta"])
  results = runner.run(specs, "method arms (headline seeds)") if specs else []
  out: dict[str, dict[str, Any]] = {m: {} for m in methods}
  for r in results:
    out[r["method"]][str(r["seed"])] = r
  return out


# --- timing -------------------------------------------------------------------------------------


def time_step_kinds(config: ml_collections.ConfigDict, tuning: dict[str, Any], methods: list[str]) -> dict[str, Any]:
  """Median ms per step of each kind, for the baseline and each method arm, measured in rounds that
  interleave the arms (so a change in machine load hits them alike), each step timed alone."""
  b = config.benchmark
  seed = int(b.tuning_seeds[0])
  n = int(config.trainer.steps)

  def exp_config(kind, method=""):
    spec = run_spec(
      config, kind=kind, seed=seed, lr=tuning["best_lr"], steps=n, beta=tuning["averaging_beta"], method=method
    )
    c = ml_collections.ConfigDict(spec["config"])
    c.trainer.update(progress=False, compile_cache=False, compile_cache_dir="")
    return c

  base_cfg = exp_config("anchor")
  task = gpt2_small.build_task(base_cfg)
  arms: dict[str, Any] = {}
  compile_s: dict[str, float] = {}
  for name in ["baseline"] + methods:
    c = base_cfg if name == "baseline" else exp_config("method", name)
    driver = train_lib.make_driver(c, init_params=task.init_params, loss_fn=task.loss_fn)
    state = driver.init_state()
    batch = task.train_batch(0)
    t0 = time.perf_counter()
    if c.mode == "baseline":
      fns = [_anchor_programs(c, task.loss_fn).step.lower(state, batch, driver.schedule).compile()]
    else:
      fns = driver.compiled_phase_steps(state, batch)
    compile_s[name] = time.perf_counter() - t0
    # One untimed call of every program, on a copy of the state (the programs donate it): a
    # program's first execution carries one-time costs (~100 ms on CPU), which would dominate the
    # median of a kind timed only a few times (a jump arm's CORRECT entry).
    for fn in fns:
      jax.block_until_ready(fn(jax.tree.map(lambda x: x.copy(), state), batch, driver.schedule))
    predictor = c.hybrid.get("method", "velocity") if c.mode == "hybrid" else ""
    arms[name] = {"fns": fns, "state": state, "schedule": driver.schedule, "step": 0, "predictor": predictor}

  samples: dict[str, dict[str, list[float]]] = {name: {} for name in arms}
  for _ in range(int(b.timing_rounds)):
    for name, arm in arms.items():
      for _ in range(int(b.timing_steps)):
        batch = task.train_batch(arm["step"] % n)
        if len(arm["fns"]) == 1:  # baseline-mode arms
          branch, fn = None, arm["fns"][0]
        else:
          branch = int(jax.device_get(arm["state"].controller.next_branch))
          fn = arm["fns"][branch]
        t0 = time.perf_counter()
        arm["state"], metrics = fn(arm["state"], batch, arm["schedule"])
        jax.block_until_ready(arm["state"])
        dt = time.perf_counter() - t0
        if branch is None:
          kind = "baseline" if name == "baseline" else REAL_STEP
        else:
          measured, snapshot = jax.device_get((metrics["measured"], metrics.get("snapshot", False)))
          kind = step_kind(branch, bool(measured), arm["predictor"], bool(snapshot))
        samples[name].setdefault(kind, []).append(dt)
        arm["step"] += 1
      if arm["predictor"] == "jump":
        # Jumps are rare in a run (one per `hybrid.jump.every` real steps): time the jump step
        # itself, twice a round, at the state the arm has reached (wherever it is, a jump step
        # scores every candidate; accepted or not, its cost is the same).
        for _ in range(2):
          t0 = time.perf_counter()
          arm["state"], _ = arm["fns"][Branch.PREDICT_STEP](
            arm["state"], task.train_batch(arm["step"] % n), arm["schedule"]
          )
          jax.block_until_ready(arm["state"])
          samples[name].setdefault(JUMP_STEP, []).append(time.perf_counter() - t0)
  return {
    "ms_per_step": {
      name: {kind: 1e3 * statistics.median(v) for kind, v in per.items()} for name, per in samples.items()
    },
    "samples": {name: {kind: len(v) for kind, v in per.items()} for name, per in samples.items()},
    "compile_s": compile_s,
    "rounds": int(b.timing_rounds),
    "steps_per_round": int(b.timing_steps),
  }


# --- figures ------------------------------------------------------------------------------------


def method_figures(
  curves: dict[str, Any], runs: dict[str, Any], timing: dict[str, Any] | None, budgets: list[int]
) -> dict[str, Any]:
  """Every figure of one method arm against both anchors, per seed and summarised (pure: the tests
  recompute it)."""
  seeds = sorted(runs, key=int)
  out: dict[str, Any] = {"seeds": seeds}
  base_ms = None if timing is None else timing.get("baseline", {}).get("baseline")
  method_ms = None if timing is None else timing.get("method")
  for anchor in ANCHORS:
    per = {"backward_ratio": [], "pass_ratio": [], "wallclock_ratio": []}
    for s in seeds:
      r = runs[s]
      reach = protocol.steps_to_reach(budgets, curves[anchor][s], r["final_loss"])
      per["backward_ratio"].append(protocol.ratio(reach, r["backward_passes"]))
      passes = r["backward_passes"] + FORWARD_COST * r["validation_forwards"]
      per["pass_ratio"].append(protocol.ratio(reach, passes))
      wall = _method_ms(r["step_kinds"], method_ms)
      if base_ms is None or wall is None:
        per["wallclock_ratio"].append({"value": None, "lower_bound": False, "baseline_steps": reach.steps})
      else:
        base_wall = None if reach.steps is None else reach.steps * base_ms
        per["wallclock_ratio"].append(
          {
            "value": None if base_wall is None else base_wall / wall,
            "lower_bound": reach.lower_bound,
            "baseline_ms": base_wall,
            "method_ms": wall,
          }
        )
    at_n = [curves[anchor][s][budgets.index(runs[s]["steps"])] for s in seeds]  # the anchor at the method's budget
    final = [runs[s]["final_loss"] for s in seeds]
    out[anchor] = {
      **{k: protocol.summarize(v) for k, v in per.items()},
      "per_seed": per,
      "final_loss_gap": {
        **dict(zip(("mean", "std"), protocol.mean_std([(m - a) / a for m, a in zip(final, at_n)]))),
        "anchor_final_loss": at_n,
        "method_final_loss": final,
      },
      "paired_difference": protocol.paired_difference(final, at_n) if len(seeds) >= 2 else None,
    }
  out["final_loss"] = protocol.mean_std([runs[s]["final_loss"] for s in seeds])
  out["final_loss_raw"] = protocol.mean_std([runs[s]["final_raw"] for s in seeds])
  out["backward_passes"] = protocol.mean_std([runs[s]["backward_passes"] for s in seeds])
  out["validation_forwards"] = protocol.mean_std([runs[s]["validation_forwards"] for s in seeds])
  if all("jumps" in runs[s] for s in seeds):
    for k in ("jumps", "jump_steps"):
      out[k] = protocol.mean_std([runs[s][k] for s in seeds])
    gains = [runs[s]["mean_persisting_gain"] for s in seeds if runs[s]["mean_persisting_gain"] is not None]
    out["mean_persisting_gain"] = protocol.mean_std(gains) if gains else None
  return out


def skip_control_comparison(figures: dict[str, Any], runs: dict[str, dict[str, Any]]) -> None:
  """Adds to every arm's figures its paired final-loss difference from the skip control (the same
  jump decisions advancing the schedule without moving a weight; `skip_control_outer` for
  `jump_outer`, `skip_control_forecast` for `jump_forecast`), when that control ran: prediction is
  credited only with what it adds to skipping schedule steps."""
  for m, f in figures.items():
    control = "skip_control" + (m[len("jump") :] if m.startswith("jump") else "")
    if m.startswith("skip_control") or control not in runs:
      continue
    skip = runs[control]
    seeds = [s for s in sorted(runs[m], key=int) if s in skip]
    if len(seeds) >= 2:
      f["vs_skip_control"] = protocol.paired_difference(
        [runs[m][s]["final_loss"] for s in seeds], [skip[s]["final_loss"] for s in seeds]
      )


def _method_ms(kinds: dict[str, int], ms: dict[str, float] | None) -> float | None:
  """A run's training time from its step counts by kind and the median time of each kind."""
  if ms is None or any(k not in ms for k in kinds):
    return None
  return sum(count * ms[k] for k, count in kinds.items())


def anchor_figures(curves: dict[str, Any], budgets: list[int], n: int) -> dict[str, Any]:
  """The anchors themselves: final losses at N, and the averaging anchor's lead over the raw one in
  steps (baseline steps needed to reach the averaged loss at N, per seed)."""
  seeds = sorted(curves["baseline"], key=int)
  i = budgets.index(n)
  raw = [curves["baseline"][s][i] for s in seeds]
  avg = [curves["averaged_baseline"][s][i] for s in seeds]
  lead = [protocol.steps_to_reach(budgets, curves["baseline"][s], a) for s, a in zip(seeds, avg)]
  return {
    "final_loss": {"baseline": protocol.mean_std(raw), "averaged_baseline": protocol.mean_std(avg)},
    "averaging_vs_raw": protocol.paired_difference(avg, raw) if len(seeds) >= 2 else None,
    "averaging_lead_steps": {
      "per_seed": [None if r.steps is None else r.steps - n for r in lead],
      "lower_bound": [r.lower_bound for r in lead],
    },
  }


def phenomena(curves: dict[str, Any], budget_runs: dict[str, Any], budgets: list[int], n: int) -> dict[str, Any]:
  """The two facts a preset must show for its figures to mean anything.

  * Mid-run, the averaged params are worth many steps of the raw run: at the eval point nearest N/2
    of each headline seed's N-step run, how many steps later the raw iterate of the same run first
    reaches the averaged params' loss (linear interpolation between eval points).
  * A 25% larger budget lowers the final loss beyond the paired seed noise (both anchors).
  """
  seeds = sorted(curves["baseline"], key=int)
  worth = []
  for s in seeds:
    curve = budget_runs[f"{s}/{n}"]["curve"]
    mid = min(curve, key=lambda p: abs(p["step"] - n / 2))
    target, steps = mid["eval_loss_averaged"], None
    for a, b in zip(curve, curve[1:]):
      if b["step"] <= mid["step"]:
        continue
      if b["eval_loss_raw"] <= target:
        lo, hi = a["eval_loss_raw"], b["eval_loss_raw"]
        frac = 1.0 if lo == hi else min(max((lo - target) / (lo - hi), 0.0), 1.0)
        at = a["step"] + frac * (b["step"] - a["step"]) if lo > target else a["step"]
        steps = at - mid["step"]
        break
    worth.append({"seed": s, "at_step": mid["step"], "steps": steps, "reached": steps is not None})
  out: dict[str, Any] = {"averaging_worth_mid_run": worth}
  f125 = round(1.25 * n)
  if f125 in budgets and len(seeds) >= 2:
    i, j = budgets.index(n), budgets.index(f125)
    out["budget_1.25N_vs_N"] = {
      a: protocol.paired_difference([curves[a][s][j] for s in seeds], [curves[a][s][i] for s in seeds]) for a in ANCHORS
    }
    # The eval set's own sampling error of that gain: the same eval batches score both runs, so it
    # is the standard error of the per-batch difference (averaged params), per seed.
    ses = []
    for s in seeds:
      a, b = budget_runs[f"{s}/{f125}"], budget_runs[f"{s}/{n}"]
      if "final_averaged_per_batch" in a and "final_averaged_per_batch" in b:
        d = np.subtract(a["final_averaged_per_batch"], b["final_averaged_per_batch"])
        ses.append(float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0)
    out["eval_sampling_se_of_the_1.25N_gain"] = ses
  return out


def headline(result: dict[str, Any], method: str | None) -> dict[str, Any]:
  """The compact summary (`headline.json`) of one family's protocol and its main method arm."""
  tuning, anchors = result["tuning"], result["anchor_figures"]
  h: dict[str, Any] = {
    "preset": result["preset"],
    "family": result["family"],
    "method": method,
    "tuning_seeds": result["tuning_seeds"],
    "seeds": result["seeds"],
    "steps": result["steps"],
    "lr_sweep": {
      str(r["lr"]): r["loss_averaged"]
      for r in tuning["rows"]
      if r["seed"] == result["tuning_seeds"][0] and r["budget"] == result["steps"]
    },
    "best_lr": tuning["best_lr"],
    "averaging_beta": tuning["averaging_beta"],
    "budgets": result["budgets"],
    "averaging_lead_steps": anchors["averaging_lead_steps"]["per_seed"],
  }
  final = {
    "baseline": anchors["final_loss"]["baseline"],
    "averaged_baseline": anchors["final_loss"]["averaged_baseline"],
  }
  if method is not None:
    f = result["figures"][method]
    for key in ("backward_ratio", "pass_ratio", "wallclock_ratio"):
      h[key] = {f"vs_{a}": f[a][key]["mean"] for a in ANCHORS}
      h[key + "_std"] = {f"vs_{a}": f[a][key]["std"] for a in ANCHORS}
      h[key + "_null_or_bound"] = {f"vs_{a}": [f[a][key]["n_null"], f[a][key]["n_lower_bound"]] for a in ANCHORS}
    h["final_loss_gap"] = {f"vs_{a}": f[a]["final_loss_gap"]["mean"] for a in ANCHORS}
    h["paired_difference"] = {f"vs_{a}": f[a]["paired_difference"]["verdict"] for a in ANCHORS}
    if "vs_skip_control" in f:
      h["vs_skip_control"] = f["vs_skip_control"]
    final["method"] = f["final_loss"]
  h["final_loss"] = final
  return h


# --- report -------------------------------------------------------------------------------------


def _paired_cell(d: dict[str, Any] | None) -> str:
  return "—" if d is None else f"{d['mean']:+.4f} ± {d['se']:.4f} se ({d['verdict']})"


def _pm(pair: Sequence[float] | None, digits: int = 4) -> str:
  if pair is None or pair[0] is None:
    return "n/a"
  return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def _ratio_cell(s: dict[str, Any]) -> str:
  if s["mean"] is None:
    return f"not reached ({s['n_null']}/{s['n']} seeds)"
  std = "" if s["std"] is None else f" ± {s['std']:.2f}"
  notes = []
  if s["n_null"]:
    notes.append(f"{s['n_null']} not reached")
  if s["n_lower_bound"]:
    notes.append(f"{s['n_lower_bound']} lower bounds")
  return f"{s['mean']:.2f}×{std}" + (f" ({', '.join(notes)})" if notes else "")


def markdown(result: dict[str, Any]) -> str:
  """results.md: the tuning, the anchors and one column per method arm (means ± std over seeds)."""
  t, a = result["tuning"], result["anchor_figures"]
  lines = [
    f"# Benchmark: preset `{result['preset']}`, family `{result['family']}`",
    "",
    f"N = {result['steps']} steps; headline seeds {result['seeds']}, tuning seeds {result['tuning_seeds']}; "
    f"command: `{result['command']}`",
    "",
    "## Tuning (tuning seeds only)",
    "",
    "| peak LR | seed | steps | raw final loss | averaged final loss |",
    "|---|---|---|---|---|",
  ]
  for r in sorted(t["rows"], key=lambda r: (r["budget"], r["seed"], r["lr"])):
    lines.append(f"| {r['lr']:.3g} | {r['seed']} | {r['budget']} | {r['loss_raw']:.4f} | {r['loss_averaged']:.4f} |")
  lines += [
    "",
    f"Best LR {t['best_lr']:.3g} (mean of the best two over both tuning seeds: "
    + ", ".join(f"{float(k):.3g}: {v:.4f}" for k, v in t["best_two_means"].items())
    + f"); best for the raw loss alone: {t['best_lr_for_raw_loss']:.3g}. Per-budget LR: "
    + ", ".join(f"{k}N {v:.3g}" for k, v in t["per_budget_lr"].items())
    + ".",
    f"Averaging beta {t['averaging_beta']} (averaged loss on the two tuning seeds: "
    + ", ".join(f"{k}: {statistics.fmean(v):.4f}" for k, v in t["beta_table"].items())
    + f"). Seed noise of one final loss: {t['seed_noise']:.4f}.",
    "",
    "## Anchors (headline seeds)",
    "",
    "| budget | " + " | ".join(ANCHORS) + " |",
    "|---|---|---|",
  ]
  for i, steps in enumerate(result["budgets"]):
    cells = [protocol.mean_std([result["curves"][an][s][i] for s in result["curves"][an]]) for an in ANCHORS]
    lines.append(f"| {steps} | " + " | ".join(_pm(c) for c in cells) + " |")
  lead = [x for x in a["averaging_lead_steps"]["per_seed"] if x is not None]
  lines += [
    "",
    "Averaging's lead at N, in baseline steps (per seed): "
    + ", ".join("not reached" if x is None else f"{x:+.0f}" for x in a["averaging_lead_steps"]["per_seed"])
    + (f" (mean {statistics.fmean(lead):+.0f})" if lead else "")
    + (
      "; lower bounds: " + str(a["averaging_lead_steps"]["lower_bound"])
      if any(a["averaging_lead_steps"]["lower_bound"])
      else ""
    )
    + ".",
  ]
  ph = result["phenomena"]
  worth = [w["steps"] for w in ph["averaging_worth_mid_run"]]
  lines.append(
    "Averaged params mid-run are worth "
    + ", ".join("more than the rest of the run" if w is None else f"{w:.0f}" for w in worth)
    + " steps of the raw run (per seed)."
  )
  if "budget_1.25N_vs_N" in ph:
    lines.append(
      "1.25N against N (paired): "
      + "; ".join(
        f"{an} {d['mean']:+.4f} ± {d['se']:.4f} (se) → {d['verdict']}" for an, d in ph["budget_1.25N_vs_N"].items()
      )
      + "."
    )
  ses = ph.get("eval_sampling_se_of_the_1.25N_gain") or []
  lines.append(
    f"Eval set: {result['eval']['batches']} batches; the sampling standard error of one averaged loss is about "
    f"{result['eval']['sampling_se']:.4f}"
    + (f", and of the 1.25N-vs-N gain (the same batches score both runs) {statistics.fmean(ses):.4f}." if ses else ".")
  )
  methods = list(result["figures"])
  if methods:
    lines += ["", "## Method arms (headline seeds; ratios > 1 mean fewer than the anchor needs)", ""]
    lines.append("| figure | " + " | ".join(methods) + " |")
    lines.append("|---|" + "---|" * len(methods))

    def row(label, cell):
      lines.append(f"| {label} | " + " | ".join(cell(result["figures"][m], m) for m in methods) + " |")

    for an in ANCHORS:
      for key in ("backward_ratio", "pass_ratio", "wallclock_ratio"):
        row(f"{key} vs {an}", lambda f, m, an=an, key=key: _ratio_cell(f[an][key]))
    for an in ANCHORS:
      row(
        f"final loss − {an} at N",
        lambda f, m, an=an: (
          f"{100 * f[an]['final_loss_gap']['mean']:+.2f}% ({f[an]['paired_difference']['verdict']})"
          if f[an]["paired_difference"]
          else f"{100 * f[an]['final_loss_gap']['mean']:+.2f}%"
        ),
      )
    row("final loss (its model: averaged)", lambda f, m: _pm(f["final_loss"]))
    row("final loss of its raw params", lambda f, m: _pm(f["final_loss_raw"]))
    row("backward passes", lambda f, m: _pm(f["backward_passes"], 0))
    row("validation / probe forwards", lambda f, m: _pm(f["validation_forwards"], 0))
    if any("jumps" in f for f in result["figures"].values()):
      row("accepted jumps", lambda f, m: _pm(f.get("jumps"), 1))
      row("schedule steps jumped", lambda f, m: _pm(f.get("jump_steps"), 0))
      row("persisting gain per jump (log-loss)", lambda f, m: _pm(f.get("mean_persisting_gain"), 4))
    if any("vs_skip_control" in f for f in result["figures"].values()):
      row("final loss − skip control (paired)", lambda f, m: _paired_cell(f.get("vs_skip_control")))
    ms = result["timing"]["ms_per_step"]
    row("median ms per step by kind", lambda f, m: ", ".join(f"{k} {v:.1f}" for k, v in sorted(ms[m].items())))
    lines.append("")
    lines.append(f"Baseline step: {ms['baseline']['baseline']:.2f} ms (median, interleaved).")
  lines += [
    "",
    "Compile time (s, separate from every figure): "
    + json.dumps({k: round(v, 1) for k, v in result["timing"]["compile_s"].items()})
    + ".",
    f"Wall time {result['wall_s']:.0f} s ({result['runs_trained']} runs trained, {result['runs_cached']} from the "
    f"cache); machine: {result['machine']['cpu_cores']} CPU cores, {result['machine']['device_kind']}, jax "
    f"{result['machine']['jax']}.",
  ]
  return "\n".join(lines) + "\n"


def save_plots(result: dict[str, Any], outdir: str) -> list[str]:
  """Budget curves with the method points, the LR sweep and every arm's eval curve (one seed)."""
  paths = []
  points = {
    m: {
      "x": f["backward_passes"][0],
      "x_std": f["backward_passes"][1],
      "y": f["final_loss"][0],
      "y_std": f["final_loss"][1],
    }
    for m, f in result["figures"].items()
  }
  names = {"baseline": "baseline (raw)", "averaged_baseline": "averaged baseline"}
  title = f"{result['preset']} {result['family']}"
  paths.append(
    plotting.plot_budget_curves(
      os.path.join(outdir, "budget_curve.png"),
      result["budgets"],
      {names[a]: result["curves"][a] for a in ANCHORS},
      points,
      title=title + ": final eval loss against backward passes",
    )
  )
  paths.append(plotting.plot_lr_sweep(os.path.join(outdir, "lr_sweep.png"), result["tuning"]["rows"], title=title))
  seed = str(result["seeds"][0])
  arms = {"baseline (N)": result["budget_runs"][f"{seed}/{result['steps']}"]["curve"]}
  for m, runs in result["method_runs"].items():
    arms[m] = runs[seed]["curve"]
  paths.append(
    plotting.plot_arm_eval_curves(os.path.join(outdir, "eval_curves.png"), arms, title=f"{title}, seed {seed}")
  )
  return paths


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
    "load_average_1m": os.getloadavg()[0],
  }


# --- main ---------------------------------------------------------------------------------------


def run_benchmark(config: ml_collections.ConfigDict, workdir: str, command: str = "") -> dict[str, Any]:
  """The whole protocol for `config`'s family; writes benchmark.json, headline.json, results.md and
  the plots into `workdir` (and into `benchmark.publish` when set)."""
  validate_benchmark(config)
  methods = parse_methods(config)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  b = config.benchmark
  n = int(config.trainer.steps)
  task = gpt2_small.build_task(experiment_config(config))
  epochs = {
    str(float(f)): gpt2_small.corpus_epochs(_with_steps(config, round(f * n)), task.prepared.n_train) for f in b.budgets
  }
  print(
    f"benchmark {b.preset} {b.family}: N={n}, {task.extra_meta['n_params']:,} params, the longest budget reads the "
    f"{task.prepared.n_train:,}-token training split {max(epochs.values()):.2f} times; workdir {workdir}",
    flush=True,
  )
  warning = gpt2_small.epochs_warning(_with_steps(config, round(max(b.budgets) * n)), task.prepared.n_train)
  if warning:
    print(warning, flush=True)
  cache = None
  if config.trainer.compile_cache:  # a cold benchmark starts with an empty <workdir>/jax_cache
    cache = config.trainer.compile_cache_dir or os.path.join(os.path.abspath(workdir), "jax_cache")
  runner = Runner(workdir, int(b.workers), cache)
  try:

    def at_chosen_lr(lr: float, beta: float) -> list[dict[str, Any]]:
      print(f"best LR {lr:.4g}, averaging beta {beta}", flush=True)
      return curve_specs(config, lambda f: lr, beta) + method_specs(config, methods, lr, beta)

    tuning = tune(config, runner, also=at_chosen_lr)
    curves = budget_curves(config, runner, tuning)
    mruns = method_runs(config, runner, tuning, methods)
  except BaseException:
    runner.close(cancel=True)
    raise
  runner.close()
  print("--- timing (interleaved, this process)", flush=True)
  timing = time_step_kinds(config, tuning, methods)
  figures = {
    m: method_figures(
      curves["curves"],
      mruns[m],
      {"baseline": timing["ms_per_step"]["baseline"], "method": timing["ms_per_step"][m]},
      curves["budgets"],
    )
    for m in methods
  }
  skip_control_comparison(figures, mruns)
  n_runs = curves["runs"][f"{b.seeds[0]}/{n}"]
  sampling_se = n_runs["eval_batch_std"] / math.sqrt(n_runs["eval_batches"])
  result: dict[str, Any] = {
    "preset": b.preset,
    "family": b.family,
    "command": command,
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "code_version": runner.versions,
    "machine": machine_info(),
    "config": json.loads(config.to_json()),
    "steps": n,
    "tuning_seeds": [int(s) for s in b.tuning_seeds],
    "seeds": [int(s) for s in b.seeds],
    "budgets": curves["budgets"],
    "corpus_epochs": epochs,
    "tuning": tuning,
    "curves": curves["curves"],
    "budget_runs": curves["runs"],
    "method_runs": mruns,
    "timing": timing,
    "anchor_figures": anchor_figures(curves["curves"], curves["budgets"], n),
    "phenomena": phenomena(curves["curves"], curves["runs"], curves["budgets"], n),
    "eval": {"batches": n_runs["eval_batches"], "sampling_se": sampling_se},
    "figures": figures,
    "runs_trained": runner.ran,
    "runs_cached": runner.reused,
  }
  result["wall_s"] = time.perf_counter() - t_start
  result["headline"] = headline(result, methods[0] if methods else None)
  table = markdown(result)
  with open(os.path.join(workdir, "benchmark.json"), "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(workdir, "headline.json"), "w") as f:
    json.dump(result["headline"], f, indent=2)
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(table)
  result["plots"] = save_plots(result, workdir)
  if b.publish:
    os.makedirs(b.publish, exist_ok=True)
    for name in ["headline.json", "results.md", "benchmark.json"] + [os.path.basename(p) for p in result["plots"]]:
      shutil.copy(os.path.join(workdir, name), os.path.join(b.publish, name))
  print("\n" + table)
  print(f"benchmark wall time {result['wall_s']:.0f} s; outputs in {workdir}", flush=True)
  return result


def _with_steps(config: ml_collections.ConfigDict, steps: int) -> ml_collections.ConfigDict:
  c = experiment_config(config)
  c.trainer.steps = steps
  return c


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _FLAGS[0].value
  workdir = _FLAGS[1].value or os.path.join("runs", f"benchmark-{config.benchmark.preset}-{config.benchmark.family}")
  command = "python -m experiments.benchmark " + " ".join(sys.argv[1:])
  cli.run_as_program(lambda: run_benchmark(config, workdir, command))


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
    _CONFIG_PATH + ":long",
    "Output folder (default: runs/benchmark-<preset>-<family>); its cache/ is reused by a later run.",
  )
  app.run(main)
