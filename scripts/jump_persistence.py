"""Diagnostic: does a move's gain persist when training continues?

  python scripts/jump_persistence.py --config=long
  python scripts/jump_persistence.py --config=long,wsd --lr=8.5e-3 --at=1000,2000 --out=jump.json
  python scripts/jump_persistence.py --config=quick --at=10,20 --after=5,10 --every=5    # seconds
  python scripts/jump_persistence.py --config=long --drift=snapshot --span=200 \\
      --candidates=avg,raw+200r,raw-100r,avg+200r

A move (jump) puts the params somewhere the optimizer did not take them: to the averaged params, or
along the drift r of the averaged iterate (the direction the run is travelling in, per step). The
held-out loss right after a move can look like a gain worth hundreds of steps and still be lost
within a few dozen real steps (Adam, restarted from a point off its trajectory, first climbs back
into its valley), or it can persist. Only the persisting gain says whether a method that makes such
moves saves real steps, so a move is judged by the loss *after training continues from it*, never
by the loss right after it.

What it does, on the benchmark's anchor run (same init, data order `task.train_batch(step)`,
schedule `make_schedule(optim, trainer.steps)` and jitted `optim.train_step`, averaging on):

1. Trains the real run to the end of its schedule, evaluating the raw and the averaged params every
   `--every` steps (and at every jump and continuation step): the real run's curves.
2. At each step t in `--at` it takes the drift r:
   * `ema_pair` (default): r = (EMA_fast - EMA_slow) / (lag_slow - lag_fast), with EMA_fast the
     train state's average (`trainer.averaging_beta`), EMA_slow a second average at `--slow_beta`,
     and lag the mean age of an average's weights: beta/(1-beta) for a long run (`--lag=asymptotic`),
     less early on, where the bias correction still weighs the recent params more (`--lag=exact`,
     the default: beta/(1-beta) - n beta^n / (1 - beta^n) after n steps). For params moving at a
     constant velocity v, both give r = v.
   * `snapshot`: r = (avg_t - avg_{t-d}) / d with d = `--span`.
3. For each candidate in `--candidates` (`raw`, `avg`, `raw+Kr`, `avg+Kr`, `raw-Kr`, ...: the base
   params plus K steps of drift) it evaluates the moved params right after the move, then continues
   *real* steps from them with the real run's optimizer state, schedule and batches (t, t+1, ...),
   and evaluates at t + a for a in `--after`. The continued run's average is the real run's average
   translated by K r (the move's drift part; a jump from raw to avg leaves the average where it is),
   so `raw+0r` continues the real run exactly.
4. Reports, per candidate and point: the raw and the averaged loss, the real run's at the same step,
   and the gain in steps: how many steps later (positive) or earlier (negative) the real run's
   running-min curve reaches the candidate's loss (linear interpolation between eval points;
   None when the real run never reaches it). The raw loss is read against the real raw curve, the
   averaged loss against the real averaged curve. `real_gain_*` is the real run's own gain at that
   step (0, or negative when its loss there sits above an earlier minimum): a candidate that merely
   matches the real run scores it.

Use a tuning seed (the default, 1001): a diagnostic that informs a method's design must not look at
the headline seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from experiments import gpt2_small  # noqa: E402
from experiments.configs import benchmark as bench_cfg  # noqa: E402
from hybridjax import optim as optim_lib  # noqa: E402
from hybridjax import preflight
from hybridjax.bench import specs as bench_specs  # noqa: E402
from hybridjax.loop import baseline  # noqa: E402
from hybridjax.loop import train as train_lib  # noqa: E402

DEFAULT_CANDIDATES = "avg,raw+100r,raw+200r,raw+400r,avg+100r,avg+200r"
_CANDIDATE_RE = re.compile(r"^(raw|avg)(?:([+-])(\d+(?:\.\d*)?|\.\d+)r)?$")


# --- small pure pieces (tested in tests/test_diagnostics.py) ------------------------------------


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A move: `base` ('raw' or 'avg') params plus `k` steps of drift."""

  name: str
  base: str
  k: float


def parse_candidates(spec: str) -> list[Candidate]:
  """'avg,raw+100r,raw-50r,...' -> candidates; raises ValueError naming a bad one."""
  out = []
  for name in (s.strip() for s in spec.split(",")):
    if not name:
      continue
    m = _CANDIDATE_RE.match(name)
    if m is None:
      raise ValueError(f"--candidates: cannot parse {name!r}; use raw, avg, raw+Kr, avg+Kr or raw-Kr (e.g. raw+200r)")
    base, sign, k = m.groups()
    out.append(Candidate(name=name, base=base, k=(-1.0 if sign == "-" else 1.0) * float(k or 0.0)))
  if not out:
    raise ValueError("--candidates: give at least one candidate")
  if len({c.name for c in out}) != len(out):
    raise ValueError(f"--candidates: names repeat in {spec!r}")
  return out


def parse_ints(spec: str, flag: str) -> list[int]:
  """'25,50,100' -> sorted distinct positive ints."""
  try:
    values = sorted({int(s) for s in spec.split(",") if s.strip()})
  except ValueError:
    raise ValueError(f"{flag}: expected a comma list of integers, got {spec!r}") from None
  if not values or values[0] <= 0:
    raise ValueError(f"{flag}: expected positive integers, got {spec!r}")
  return values


def ema_lag(beta: float, count: int | None = None) -> float:
  """The mean age, in steps, of the weights of a bias-corrected average at `beta` (`optim.Averaging`).

  After `count` averaged steps the weights are proportional to beta^age for ages 0..count-1, so the
  mean age is beta/(1-beta) - count beta^count / (1 - beta^count); `count=None` is the long-run
  limit beta/(1-beta). Params moving at velocity v sit lag * v ahead of their average.
  """
  beta = float(beta)
  lag = beta / (1.0 - beta)
  if count is None:
    return lag
  count = int(count)
  if count < 1:
    raise ValueError(f"an average needs at least one step, got count={count}")
  return lag - count * beta**count / (1.0 - beta**count)


def ema_pair_drift(fast: Any, slow: Any, lag_fast: float, lag_slow: float) -> Any:
  """The drift per step from two averages of one run: (fast - slow) / (lag_slow - lag_fast).

  For params theta_t = theta_0 + t v, an average with lag L is theta_t - L v, so the difference of
  two averages is (L_slow - L_fast) v. Leafwise over pytrees (numpy or jax arrays), in float32.
  """
  gap = float(lag_slow) - float(lag_fast)
  if gap == 0.0:
    raise ValueError("the two averages have the same lag: the drift is undefined (use a different --slow_beta)")
  scale = np.float32(1.0 / gap)
  return jax.tree.map(lambda f, s: (np.asarray(f, np.float32) - np.asarray(s, np.float32)) * scale, fast, slow)


def snapshot_drift(avg_now: Any, avg_before: Any, span: int) -> Any:
  """The drift per step of the average over the last `span` steps: (avg_t - avg_{t-span}) / span."""
  scale = np.float32(1.0 / int(span))
  return jax.tree.map(lambda a, b: (np.asarray(a, np.float32) - np.asarray(b, np.float32)) * scale, avg_now, avg_before)


def move(base: Any, drift: Any, k: float) -> Any:
  """base + k * drift, leafwise in the base's dtype (`base` itself, untouched, when k == 0)."""
  if k == 0:
    return base
  kk = np.float32(k)
  return jax.tree.map(lambda b, r: (np.asarray(b, np.float32) + kk * r).astype(np.asarray(b).dtype), base, drift)


def tree_norm(tree: Any) -> float:
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree))))


def step_reaching(steps: list[int], losses: list[float], loss: float) -> float | None:
  """The first step at which the running minimum of the curve (`steps`, `losses`), linearly
  interpolated between its points, reaches `loss`; None when it never does."""
  if not math.isfinite(loss):
    return None
  best = math.inf
  prev = None  # (step, running min) of the previous point
  for s, x in zip(steps, losses):
    if math.isfinite(x):
      best = min(best, x)
    if best <= loss:
      if prev is None or not math.isfinite(prev[1]):
        return float(s)
      p_step, p_min = prev
      return p_step + (p_min - loss) / (p_min - best) * (s - p_step)
    prev = (s, best)
  return None


def gain(steps: list[int], losses: list[float], loss: float, at_step: int) -> float | None:
  """How many steps after `at_step` (negative: before) the curve's running minimum reaches
  `loss`; None when it never does (beyond the curve's end)."""
  reached = step_reaching(steps, losses, loss)
  return None if reached is None else reached - at_step


# --- the experiment -------------------------------------------------------------------------------


def build_config(arg: str, seed: int, lr: float | None, steps: int | None) -> ml_collections.ConfigDict:
  """The anchor runs' experiment config of benchmark config `arg`, at `seed` and `lr`."""
  c = bench_specs.experiment_config(bench_cfg.get_config(arg))
  c.seed = int(seed)
  if lr is not None:
    c.optim.learning_rate = float(lr)
  if steps is not None:
    c.trainer.steps = int(steps)
  c.trainer.averaging = "ema"
  preflight.validate(c)
  return c


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(
    description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument("--config", default="long", help="a benchmark config argument: long, long,wsd, long,muon, quick, ...")
  ap.add_argument("--seed", type=int, default=1001, help="a tuning seed (default 1001), never a headline seed")
  ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the config's)")
  ap.add_argument("--steps", type=int, default=None, help="the schedule's length N (default: trainer.steps)")
  ap.add_argument("--at", default="", help="jump steps (default: 25%%, 50%%, 75%% of N)")
  ap.add_argument("--after", default="25,50,100,200", help="real steps after a jump at which to evaluate")
  ap.add_argument("--drift", choices=("ema_pair", "snapshot"), default="ema_pair")
  ap.add_argument("--slow_beta", type=float, default=0.998, help="ema_pair: the slow average's beta")
  ap.add_argument("--lag", choices=("exact", "asymptotic"), default="exact", help="ema_pair: the averages' lags")
  ap.add_argument("--span", type=int, default=200, help="snapshot: d")
  ap.add_argument("--candidates", default=DEFAULT_CANDIDATES)
  ap.add_argument("--every", type=int, default=25, help="eval spacing of the real run's curves")
  ap.add_argument("--out", default="", help="write the result as JSON here")
  return ap


def _finite_or_none(x: Any) -> Any:
  if isinstance(x, float) and not math.isfinite(x):
    return None
  if isinstance(x, dict):
    return {k: _finite_or_none(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_finite_or_none(v) for v in x]
  return x


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """Runs the diagnostic; prints a table per jump point and returns (and with --out writes) the
  JSON-able result."""
  args = _parser().parse_args(argv)
  t_start = time.perf_counter()
  c = build_config(args.config, args.seed, args.lr, args.steps)
  n = int(c.trainer.steps)
  at = parse_ints(args.at, "--at") if args.at else sorted({max(1, round(f * n)) for f in (0.25, 0.5, 0.75)})
  after = parse_ints(args.after, "--after")
  candidates = parse_candidates(args.candidates)
  if args.every < 1:
    raise ValueError(f"--every must be >= 1, got {args.every}")
  if at[-1] >= n:
    raise ValueError(f"--at: jump steps must be below the run's length N={n}, got {at}")
  fast_beta = float(c.trainer.averaging_beta)
  if args.drift == "ema_pair" and (not 0.0 < args.slow_beta < 1.0 or args.slow_beta == fast_beta):
    raise ValueError(f"--slow_beta must be in (0, 1) and differ from trainer.averaging_beta={fast_beta}")
  if args.drift == "snapshot" and (args.span < 1 or at[0] < args.span):
    raise ValueError(f"--span must be in [1, first jump step {at[0]}], got {args.span}")

  task = gpt2_small.build_task(c)
  tx = optim_lib.make_optimizer(c.optim)
  grad_accum = c.trainer.grad_accum
  # The baseline's one step program (`loop.baseline.make_train_step`): the same bits as `train()`.
  step_fn = baseline.make_train_step(task.loss_fn, tx, grad_accum)
  eval_fn = train_lib.make_eval_fn(task.loss_fn)

  def evaluate(params):
    return train_lib.evaluate(eval_fn, params, task.eval_batches)

  schedule = optim_lib.make_schedule(c.optim, n)
  params_rng, _ = jax.random.split(jax.random.PRNGKey(c.seed))  # as `loop.train.make_driver`
  state = optim_lib.init_train_state(task.init_params(params_rng), tx, fast_beta)

  after_of = {t: [a for a in after if t + a <= n] for t in at}
  dropped = {t: [a for a in after if t + a > n] for t in at}
  eval_steps = set(range(0, n + 1, args.every)) | {n} | set(at) | {t + a for t in at for a in after_of[t]}
  snapshot_at = {t - args.span for t in at} if args.drift == "snapshot" else set()
  snapshots: dict[int, Any] = {}
  curve: dict[int, tuple[float, float]] = {}

  print(
    f"jump persistence: config {args.config} ({c.optim.name}, {c.optim.get('schedule', 'cosine')}), seed {c.seed}, "
    f"lr {c.optim.learning_rate:g}, N {n}, averaging beta {fast_beta:g}; drift {args.drift} "
    + (f"(slow beta {args.slow_beta:g}, {args.lag} lags)" if args.drift == "ema_pair" else f"(span {args.span})")
  )
  for t, d in dropped.items():
    if d:
      print(f"  note: at {t}, after {d} would pass the run's end N={n}: not evaluated")

  def jump(t: int, state, slow) -> dict[str, Any]:
    kept = jax.device_get(state)  # host copies: the real run continues from its own (donated) state
    raw, avg = kept.params, kept.averaging.params
    info: dict[str, Any] = {"step": t}
    if args.drift == "ema_pair":
      lag_f = ema_lag(fast_beta, t if args.lag == "exact" else None)
      lag_s = ema_lag(args.slow_beta, t if args.lag == "exact" else None)
      r = ema_pair_drift(avg, jax.device_get(slow.params), lag_f, lag_s)
      info.update(lag_fast=lag_f, lag_slow=lag_s)
    else:
      r = snapshot_drift(avg, snapshots.pop(t - args.span), args.span)
    info.update(drift_norm=tree_norm(r), avg_raw_distance=tree_norm(jax.tree.map(np.subtract, avg, raw)))
    info["candidates"] = []
    for cand in candidates:
      params = jax.tree.map(np.array, move(raw if cand.base == "raw" else avg, r, cand.k))  # own buffers
      moved = kept.replace(params=params, averaging=kept.averaging.replace(params=move(avg, r, cand.k)))
      points = [{"after": 0, "step": t, "raw": evaluate(moved.params), "avg": evaluate(moved.averaging.params)}]
      s = jax.device_put(moved)
      todo = set(after_of[t])
      for i in range(t, t + max(todo, default=0)):
        s, _ = step_fn(s, task.train_batch(i), schedule)
        if i + 1 - t in todo:
          points.append(
            {"after": i + 1 - t, "step": i + 1, "raw": evaluate(s.params), "avg": evaluate(s.averaging.params)}
          )
      del s
      info["candidates"].append({"name": cand.name, "base": cand.base, "k": cand.k, "points": points})
    return info

  jumps = []
  curve[0] = (evaluate(state.params), evaluate(state.averaging.params))
  if 0 in snapshot_at:
    snapshots[0] = jax.device_get(state.averaging.params)

  def at_step(done: int, state, side) -> None:
    if done in snapshot_at:
      snapshots[done] = jax.device_get(state.averaging.params)
    if done in at:
      jumps.append(jump(done, state, side[0] if side else None))

  # The anchor run (the slow EMA of `ema_pair` as its side average), evaluated at `eval_steps`.
  out = baseline.run(
    state,
    step_fn,
    train_batch=task.train_batch,
    eval_batches=task.eval_batches,
    eval_fn=eval_fn,
    schedule=schedule,
    steps=n,
    eval_steps=eval_steps,
    side_betas=[args.slow_beta] if args.drift == "ema_pair" else [],
    on_step=at_step,
  )
  curve.update({p["step"]: (p["eval_loss_raw"], p["eval_loss_averaged"]) for p in out["curve"]})

  steps = sorted(curve)
  raw_curve, avg_curve = [curve[s][0] for s in steps], [curve[s][1] for s in steps]
  for info in jumps:
    t = info["step"]
    info["real"] = {"raw": curve[t][0], "avg": curve[t][1]}
    for cand in info["candidates"]:
      for p in cand["points"]:
        real_raw, real_avg = curve[p["step"]]
        p.update(
          real_raw=real_raw,
          real_avg=real_avg,
          gain_raw=gain(steps, raw_curve, p["raw"], p["step"]),
          gain_avg=gain(steps, avg_curve, p["avg"], p["step"]),
          real_gain_raw=gain(steps, raw_curve, real_raw, p["step"]),
          real_gain_avg=gain(steps, avg_curve, real_avg, p["step"]),
        )
    print(format_jump(info, args.drift))

  result = {
    "config": args.config,
    "family": f"{c.optim.name}-{c.optim.get('schedule', 'cosine')}",
    "seed": int(c.seed),
    "lr": float(c.optim.learning_rate),
    "steps": n,
    "averaging_beta": fast_beta,
    "drift": {
      "kind": args.drift,
      "fast_beta": fast_beta,
      **({"slow_beta": args.slow_beta, "lag": args.lag} if args.drift == "ema_pair" else {"span": args.span}),
    },
    "at": at,
    "after": after,
    "every": args.every,
    "candidates": [dataclasses.asdict(cd) for cd in candidates],
    "average_of_continued_run": "the real run's average translated by k * drift",
    "curve": [{"step": s, "raw": curve[s][0], "avg": curve[s][1]} for s in steps],
    "jumps": jumps,
    "wall_s": time.perf_counter() - t_start,
  }
  result = _finite_or_none(result)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
  return result


def _fmt_gain(g: float | None) -> str:
  return "beyond" if g is None else f"{round(g):+d}"


def _fmt_loss(x: float) -> str:
  return f"{x:.4f}" if math.isfinite(x) else "nan"


def format_jump(info: dict[str, Any], drift: str) -> str:
  """A readable table of one jump point: a row per candidate and evaluated step."""
  t = info["step"]
  head = (
    f"\njump at step {t}: real raw {info['real']['raw']:.4f}, avg {info['real']['avg']:.4f}; "
    f"|r| {info['drift_norm']:.3g}/step, |avg - raw| {info['avg_raw_distance']:.3g}"
  )
  if drift == "ema_pair":
    head += f" (lags {info['lag_fast']:.1f}, {info['lag_slow']:.1f})"
  lines = [
    head,
    f"  {'candidate':<12} {'+steps':>6} {'raw':>8} {'avg':>8} {'real raw':>8} {'real avg':>8}"
    f" {'gain raw':>9} {'gain avg':>9} {'real own':>9}",
  ]
  for cand in info["candidates"]:
    for j, p in enumerate(cand["points"]):
      name = cand["name"] if j == 0 else ""
      lines.append(
        f"  {name:<12} {p['after']:>6} {_fmt_loss(p['raw']):>8} {_fmt_loss(p['avg']):>8} {p['real_raw']:>8.4f}"
        f" {p['real_avg']:>8.4f} {_fmt_gain(p['gain_raw']):>9} {_fmt_gain(p['gain_avg']):>9}"
        f" {_fmt_gain(p['real_gain_raw']) + '/' + _fmt_gain(p['real_gain_avg']):>9}"
      )
  lines.append(
    "  gain: steps the real run's running-min curve needs beyond (+) or before (-) this step to reach the loss"
  )
  lines.append("  real own: the real run's own gain there (raw/avg; below 0 when it sits above an earlier minimum)")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
