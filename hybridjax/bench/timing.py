"""Step timing: the median time of each kind of step of the baseline and every arm, measured in rounds
that interleave the arms in one process (so a change in machine load hits them alike), each step
timed alone; and each round's own median of each kind (`rounds_ms`), from which every wall-clock
ratio's spread over the rounds is computed (`figures.round_spread`). A step's kind is its arm's
`arms.step_kind`; a method's `TIME_BRANCHES` are its transitions a run reaches too rarely to time
(the jump predictor's attempt), timed explicitly twice a round at whatever state the arm has reached."""

from __future__ import annotations

import collections
import statistics
import time
from typing import Any

import jax

from hybridjax import registry
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.specs import run_spec, task_name
from hybridjax.bench.studies import Config, Record
from hybridjax.loop import baseline
from hybridjax.loop import train as train_lib

BASELINE = "baseline"  # the anchor's step kind


def time_step_kinds(config: Config, tuning: Record, methods: list[str]) -> Record:
  """Median ms per step of each kind, for the baseline and each method arm in `methods`."""
  defined = arms_lib.arms(config)
  lr, beta = tuning["best_lr"], tuning["averaging_beta"]
  base_cfg = _run_config(config, "anchor", lr, beta)
  task = tasks_lib.build(task_name(config), base_cfg)
  prepared = {BASELINE: _prepare(base_cfg, task, None)} | {
    name: _prepare(_run_config(config, "method", lr, beta, name), task, defined[name]) for name in methods
  }
  return _summary(prepared, config)


def time_baselines(entries: dict[str, tuple[Config, float, float]]) -> Record:
  """Median ms per baseline step of several configs (name -> (benchmark config, LR, averaging beta)),
  interleaved in rounds as `time_step_kinds` times arms; the rounds and steps are the first
  config's `benchmark.timing_rounds` and `timing_steps`."""
  prepared = {}
  for name, (config, lr, beta) in entries.items():
    c = _run_config(config, "anchor", lr, beta)
    prepared[name] = _prepare(c, tasks_lib.build(task_name(config), c), None)
  out = _summary(prepared, next(iter(entries.values()))[0])
  return out | {
    field: {name: per[BASELINE] for name, per in out[field].items()}
    for field in ("ms_per_step", "samples", "rounds_ms")
  }


def _run_config(config: Config, kind: str, lr: float, beta: float, method: str = "") -> Config:
  """The experiment config of `config`'s N-step run of `kind` (and arm `method`) on the first tuning seed."""
  seed, n = int(config.benchmark.tuning_seeds[0]), int(config.trainer.steps)
  c = Config(run_spec(config, kind=kind, seed=seed, lr=lr, steps=n, beta=beta, method=method)["config"])
  c.trainer.update(progress=False, compile_cache=False, compile_cache_dir="")
  return c


def _summary(prepared: dict[str, Record], config: Config) -> Record:
  """The `prepared` arms (name -> `_prepare`'s arm, with its compile time) timed in `config`'s rounds
  (`_timed_rounds`): each step kind's median ms over every round and its samples, and each round's own
  median ms of each kind (`rounds_ms`: one entry per round, None for a round in which the kind did not run)."""
  b = config.benchmark
  per_round = _timed_rounds(prepared, int(b.timing_rounds), int(b.timing_steps), int(config.trainer.steps))
  return _medians(per_round) | {
    "compile_s": {name: arm["compile_s"] for name, arm in prepared.items()},
    "rounds": int(b.timing_rounds),
    "steps_per_round": int(b.timing_steps),
  }


def _medians(per_round: dict[str, dict[str, list[list[float]]]]) -> Record:
  """From each arm's seconds per step kind and round: the median ms per kind over all rounds, the
  samples per kind, and each round's median ms per kind (None where the kind did not run that round)."""

  def each(f: Any) -> Record:  # f of each arm's seconds of each kind, one list per round
    return {name: {kind: f(rounds) for kind, rounds in per.items()} for name, per in per_round.items()}

  return {
    "ms_per_step": each(lambda rounds: 1e3 * statistics.median([x for r in rounds for x in r])),
    "samples": each(lambda rounds: sum(map(len, rounds))),
    "rounds_ms": each(lambda rounds: [1e3 * statistics.median(r) if r else None for r in rounds]),
  }


def _prepare(c: Config, task: Record, arm: Any) -> Record:
  """A timed arm's compiled programs and state (`arm` None: the baseline), and its compile time."""
  driver = train_lib.make_driver(c, init_params=task["init_params"], loss_fn=task["loss_fn"], tx=task.get("tx"))
  state = driver.init_state()
  batches = train_lib.step_batches(c, task["train_batch"])  # as the arm's steps receive them
  batch = batches(0)
  t0 = time.perf_counter()
  if c.mode == "baseline":
    step = baseline.make_train_step(task["loss_fn"], driver.tx, c.trainer.grad_accum)  # the anchors' program
    fns = [step.lower(state, batch, driver.schedule).compile()]
  else:
    fns = driver.phase_programs(state, batch)
  compile_s = time.perf_counter() - t0
  # One untimed call of every program, on a copy of the state (the programs donate it): a
  # program's first execution carries one-time costs (~100 ms on CPU), which would dominate the
  # median of a kind timed only a few times (a jump arm's CORRECT entry).
  for fn in fns:
    jax.block_until_ready(fn(jax.tree.map(lambda x: x.copy(), state), batch, driver.schedule))
  hybrid = arm is not None and c.mode == "hybrid"
  rare = tuple(arms_lib.declared(registry.load_method(arm.method), "TIME_BRANCHES", ())) if hybrid else ()
  return {
    "fns": fns,
    "state": state,
    "schedule": driver.schedule,
    "step": 0,
    "arm": arm,
    "rare": rare,
    "batches": batches,
    "baseline": arm is None,
    "compile_s": compile_s,
  }


def _step(a: Record, branch: int, n: int) -> tuple[float, Any]:
  """(seconds, metrics) of one step of the timed arm `a` (`_prepare`'s) by its program `branch`, on its
  next batch (fetched untimed)."""
  batch = a["batches"](a["step"] % n)
  t0 = time.perf_counter()
  a["state"], metrics = a["fns"][branch](a["state"], batch, a["schedule"])
  jax.block_until_ready(a["state"])
  return time.perf_counter() - t0, metrics


def _timed_rounds(arms: Record, rounds: int, steps: int, n: int) -> dict[str, dict[str, list[list[float]]]]:
  """Seconds of each step of each arm, by step kind and round (arm -> kind -> one list per round, empty
  for a round in which the kind did not run), over `rounds` rounds of `steps` steps of every arm."""
  samples = {name: collections.defaultdict(lambda: [[] for _ in range(rounds)]) for name in arms}
  for i in range(rounds):
    for name, a in arms.items():
      for _ in range(steps):
        # one program: the baseline and baseline-mode arms
        branch = None if len(a["fns"]) == 1 else int(jax.device_get(a["state"].controller.next_branch))
        dt, metrics = _step(a, branch or 0, n)
        if branch is None:
          kind = BASELINE if a["baseline"] else arms_lib.REAL_STEP
        else:
          row = {k: bool(v) for k, v in jax.device_get(metrics).items() if k in ("measured", "snapshot")}
          kind = arms_lib.step_kind(a["arm"], {"branch": branch, **row})
        samples[name][kind][i].append(dt)
        a["step"] += 1
      for branch in a["rare"]:
        kind = arms_lib.step_kind(a["arm"], {"branch": branch, "measured": True, "snapshot": False})
        samples[name][kind][i] += [_step(a, branch, n)[0] for _ in range(2)]
  return samples
