"""The GPU checks in one process: the 124m training step of the plain GPT-2, of the speedrun recipe
and of the hybrid trainer, timed step by step in rounds that interleave them (so a change in the
machine's load hits them alike), and the device's memory statistics around each.

  python scripts/gpu_check.py                           # 124m, 8 rounds of 10 steps per side
  python scripts/gpu_check.py --preset=tiny --rounds=4  # any preset of experiments/configs/gpt2_small.py
  python scripts/gpu_check.py --json=gpu.json
  python scripts/gpu_check.py --sides=gpt2,recipe_steps  # each cumulative step of the speedrun recipe
  python scripts/gpu_check.py --paths=new               # only the new attention and loss paths
  python scripts/gpu_check.py --table docs/results/gpu/*.json  # saved runs as markdown, and exit
  python scripts/gpu_check.py --cpu_smoke               # on a CPU: a smoke run at tiny,micro (2 rounds of 2 steps)

Each side is the training driver that `python -m experiments.gpt2_small` runs (`loop.train.make_driver`:
one jitted, donated update; the hybrid side selects its transition with `lax.switch`), on the task's
own batches (the bundled corpus, tokenised as the preset says). Reported for each side:
  median_ms   the median over rounds of each round's median step time (iqr_ms: their spread)
  ratio       median_ms over the plain GPT-2's (today's path), measured in the same rounds
  first_step_s  the side's first step, compile included
  tokens_per_s  batch x sequence over median_ms (a hybrid side's mixes its phases' steps)
  flops_per_token  the model's FLOPs a token in a training step (`model_flops_per_token`): 6 x the
              parameters that enter a matmul (the head once, lookup tables not) + 12 L T d for attention
  peak_share  tokens_per_s x flops_per_token over the device's bf16 dense peak (`PEAK_FLOPS`, by
              device name; none for a device not in the table, a CPU among them)
  attention, loss_chunk  the attention path the side's model took and its loss's chunk (0: whole)
Each side runs on one or both paths (`--paths`): `today`, the einsum attention and the whole-logits
loss (`model.attention='einsum'`, `model.loss_chunk=0`: the code before those fields existed), and
`new`, `model.attention='auto'` and `model.loss_chunk=--loss_chunk`; a new-path side is named
`<side>@new` and its `speedup` is today's side's median_ms over its own.
Memory (`memory`): `jax.devices()[0].memory_stats()` (bytes in use, and the peak so far) after each
side's state is made and after its first (compiling) step, then after every round of all the sides;
`growth_bytes` is the change in bytes in use from the first round's end to the last's: 0 when
donation reuses each state's buffers in place. A side's `peak_bytes` is the device's peak after its
first step: device-wide and cumulative, so it holds the states of the sides made before it (run
`--sides` one at a time for each side's own peak). The hybrid driver's per-step metrics, held on the
device until the training loop logs them, are fetched after each round, as the loop does at a log. On
a CPU backend, which keeps no such statistics, the live-array bytes stand in
(`hybridjax.memory.memory_snapshot`).
The hybrid side counts the phase of each step it took while timed; its warm-up and minimum full phase are shortened
(`--hybrid_warmup`) and its confidence threshold is 0, so that the timed steps reach its predicted and
correcting steps.

Run it on a quiet machine: it times. A side that fails is reported with its error; the others run.
On a CPU backend it refuses at once (124m would run for minutes and can run out of memory), unless
`--cpu_smoke`: then it runs, at `--preset=tiny,micro --rounds=2 --steps=2` unless those are given.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
import traceback
from typing import Any

import jax

SIDES = {  # name -> (the gpt2_small config argument, mode)
  "gpt2": ("{preset}", "baseline"),
  "speedrun": ("{preset},speedrun", "baseline"),
  "hybrid": ("{preset}", "hybrid"),
}
PATHS = {  # name -> (model.attention, model.loss_chunk or None for --loss_chunk)
  "today": ("einsum", 0),
  "new": ("auto", None),
}
NEW = "@new"
CPU_SMOKE = {"preset": "tiny,micro", "rounds": 2, "steps": 2}  # `--cpu_smoke`'s defaults
GPU_DEFAULTS = {"preset": "124m", "rounds": 8, "steps": 10}
# bf16 dense (no sparsity) peak FLOP/s by device name: the first entry whose key the device's kind
# contains (case-insensitive), so the more specific names come first. From the vendors' data sheets.
PEAK_FLOPS = (
  ("H100 PCIe", 756e12),
  ("H100 NVL", 835e12),
  ("H100", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
  ("GH200", 989e12),
  ("H200", 989e12),
  ("B200", 2250e12),
  ("A100", 312e12),
  ("L40S", 362e12),
  ("L4", 121e12),
  ("TPU v4", 275e12),
  ("TPU v5 lite", 197e12),
  ("TPU v5e", 197e12),
  ("TPU v5p", 459e12),
  ("TPU v6 lite", 918e12),
  ("TPU v6e", 918e12),
)
# `step:<trick>`: the plain GPT-2 with the recipe's tricks applied up to and including <trick>, as the
# recipe study trains its cumulative steps (the LRs do not change a step's cost); `recipe_steps`
# names them all.
STEP = "step:"


def side_names(arg: str) -> list[str]:
  """The sides `--sides` names, `recipe_steps` expanded into every cumulative step of the recipe."""
  from hybridjax.bench import speedrun

  names = []
  for name in arg.split(","):
    names += [STEP + t for t in speedrun.TRICKS] if name == "recipe_steps" else [name]
  for name in names:
    if name not in SIDES and not (name.startswith(STEP) and name[len(STEP) :] in speedrun.TRICKS):
      raise SystemExit(f"--sides: unknown side {name!r}: give {', '.join(SIDES)}, recipe_steps or {STEP}<trick>")
  return names


def peak_flops(device_kind: str) -> float | None:
  """The bf16 dense peak FLOP/s of a device named `device_kind` (`PEAK_FLOPS`), or None."""
  return next((peak for key, peak in PEAK_FLOPS if key.lower() in device_kind.lower()), None)


def model_flops_per_token(params: Any, n_layer: int, seq_len: int, d_model: int) -> float:
  """A training step's model FLOPs a token: 6 x the parameters that enter a matmul (every dense
  `kernel`, and the head once: `lm_head`, or the tied `wte` table; lookup tables, biases, norms and
  scalars not) + 12 L T d for the attention's two matmuls, forward and backward."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  names = [(tuple(str(getattr(k, "key", k)) for k in path), leaf) for path, leaf in flat]
  matmul = sum(leaf.size for path, leaf in names if path[-1] == "kernel")
  heads = [leaf.size for path, leaf in names if path[-1] == "lm_head"]
  head = heads[0] if heads else sum(leaf.size for path, leaf in names if path[-2:] == ("wte", "embedding"))
  return 6.0 * (matmul + head) + 12.0 * n_layer * seq_len * d_model


def _memory() -> dict[str, Any]:
  from hybridjax import memory

  snap = memory.memory_snapshot(jax.devices()[0])
  keys = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "source", "live_bytes")
  return {k: snap[k] for k in keys if k in snap}


def _side(preset: str, name: str, steps: int, hybrid_warmup: int, batch: int, loss_chunk: int = 128) -> dict[str, Any]:
  from experiments import gpt2_small
  from experiments.configs import gpt2_small as configs
  from hybridjax.bench import speedrun
  from hybridjax.loop import train as train_lib

  name, new = name.removesuffix(NEW), name.endswith(NEW)
  arg, mode = SIDES.get(name, ("{preset}", "baseline"))
  c = configs.get_config(arg.format(preset=preset))
  if name.startswith(STEP):
    tricks = list(speedrun.TRICKS)
    c = speedrun.apply_tricks(c, tricks[: tricks.index(name[len(STEP) :]) + 1])
  c.mode = mode
  attention, chunk = PATHS["new" if new else "today"]
  c.model.update(attention=attention, loss_chunk=loss_chunk if chunk is None else chunk)
  c.trainer.batch_size = batch or c.trainer.batch_size
  c.trainer.steps = 100_000  # the schedule: never at its end while timed
  if mode == "hybrid":  # so that the timed steps reach its predicted and correcting steps
    c.hybrid.warmup_steps = hybrid_warmup
    c.hybrid.full_steps = min(int(c.hybrid.full_steps), hybrid_warmup)
    c.hybrid.confidence_threshold = 0.0  # predict whenever the phase allows: the predicted step is timed
  task = gpt2_small.build_task(c)
  driver = train_lib.make_driver(c, init_params=task.init_params, loss_fn=task.loss_fn)
  state = driver.init_state()
  side = {"driver": driver, "batches": [task.train_batch(i) for i in range(steps + 1)], "memory": {}}
  side["memory"]["state made"] = _memory()  # device-wide: every side made before it included
  t0 = time.perf_counter()
  state, _ = driver.run(state, side["batches"][:1])
  side["state"] = jax.block_until_ready(state)
  side["first_step_s"] = time.perf_counter() - t0
  side["memory"]["first step"] = _memory()
  params = jax.eval_shape(task.init_params, jax.random.PRNGKey(0))
  side["params"] = sum(x.size for x in jax.tree_util.tree_leaves(params))
  m = c.model
  side["tokens_per_step"] = task.tokens_per_step
  side["flops_per_token"] = model_flops_per_token(params, m.n_layer, m.n_ctx, m.d_model)
  side["attention"], side["loss_chunk"] = task.extra_meta["attention"], int(m.loss_chunk)
  return side


def _kind(metrics: Any) -> str:
  """The step kind a step's metrics name (a hybrid step's phase), else 'full'."""
  from hybridjax.hybrid.phases import Phase

  if isinstance(metrics, dict) and "phase" in metrics:
    return Phase(int(jax.device_get(metrics["phase"]))).name.lower()
  return "full"


def _mib(n: float) -> str:
  return f"{n / 2**20:,.0f} MiB"


def markdown(results: list[dict[str, Any]]) -> str:
  """Saved runs (`--json` files) as markdown: per run, each side's step time and ratio, its first
  step, the memory in use after it, and the run's growth over its rounds."""
  out = []
  for r in results:
    batch = r.get("batch", "the preset's")
    # Runs from before the paths existed keep their table; a run that records them gets their columns.
    rated = any("tokens_per_s" in s for s in r["sides"].values())
    head = "| side | ms / step (IQR) | × the plain GPT-2's | first step (compile) | params | phases timed |"
    rule = "|---|---|---|---|---|---|"
    if rated:
      head += " attention, loss chunk | tokens / s | share of the bf16 peak | peak memory after its first step |"
      rule += "---|---|---|---|"
    out += [f"**{r['preset']}, batch {batch}, {r['device_kind']}, jax {r['jax']}**: `{r['command']}`", "", head, rule]
    for name, s in r["sides"].items():
      if "error" in s:
        out.append(f"| {name} | failed: {s['error']} | | | | |" + (" | | | |" if rated else ""))
        continue
      kinds = ", ".join(f"{k} {v}" for k, v in s["step_kinds"].items())
      row = (
        f"| {name} | {s['median_ms']:.1f} ({s['iqr_ms']:.1f}) | {s['ratio']:.3f} | {s['first_step_s']:.1f} s | "
        f"{s['params'] / 1e6:.1f}M | {kinds} |"
      )
      if rated:
        tokens = f"{s['tokens_per_s']:,.0f}" if "tokens_per_s" in s else "–"
        share = f"{100 * s['peak_share']:.1f}%" if s.get("peak_share") is not None else "–"
        peak = _mib(s["peak_bytes"]) if s.get("peak_bytes") is not None else "–"
        path = f"{s['attention']}, {s['loss_chunk']}" if "attention" in s else "–"
        row += f" {path} | {tokens} | {share} | {peak} |"
      out.append(row)
    if "memory" in r:
      readings = list(r["memory"].values())
      rounds = ", ".join(_mib(m["bytes_in_use"]) for m in readings)
      if all("peak_bytes_in_use" in m for m in readings):
        peak = max(m["peak_bytes_in_use"] for m in readings)
        limit = f"; peak {_mib(peak)} of {_mib(readings[0]['bytes_limit'])}"
      else:  # a backend without memory statistics: the live arrays' bytes (`memory_snapshot`)
        limit = f" ({readings[0].get('source', 'jax.live_arrays')})"
      out += ["", f"Device memory in use after each round: {rounds} (growth {r['growth_bytes']} B){limit}."]
    if "note" in r:
      out += ["", r["note"]]
    out.append("")
  return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", help=f"default {GPU_DEFAULTS['preset']} ({CPU_SMOKE['preset']} with --cpu_smoke)")
  p.add_argument(
    "--rounds", type=int, help=f"default {GPU_DEFAULTS['rounds']} ({CPU_SMOKE['rounds']} with --cpu_smoke)"
  )
  p.add_argument(
    "--steps",
    type=int,
    help=f"steps per side and round; default {GPU_DEFAULTS['steps']} ({CPU_SMOKE['steps']} with --cpu_smoke)",
  )
  p.add_argument(
    "--cpu_smoke", action="store_true", help="run on a CPU backend: a smoke run of the script, at a small preset"
  )
  p.add_argument(
    "--sides", default=",".join(SIDES), help=f"comma-separated: {', '.join(SIDES)}, recipe_steps, {STEP}<trick>"
  )
  p.add_argument("--paths", default="today,new", help="comma-separated: today, new (see the docstring)")
  p.add_argument("--loss_chunk", type=int, default=128, help="the new path's model.loss_chunk")
  p.add_argument("--hybrid_warmup", type=int, default=10, help="the hybrid side's hybrid.warmup_steps")
  p.add_argument(
    "--batch", type=int, default=0, help="the batch size (0: the preset's); every side's state stays on the device"
  )
  p.add_argument("--json", default="")
  p.add_argument("--table", nargs="*", help="print saved runs (--json files) as markdown, and exit")
  args = p.parse_args(argv)
  if args.table:
    results = []
    for path in args.table:
      with open(path) as f:
        results.append(json.load(f))
    print(markdown(results), end="")
    return {}
  if jax.default_backend() == "cpu" and not args.cpu_smoke:
    raise SystemExit(
      "scripts/gpu_check.py times the training step on a GPU (or TPU), and JAX's backend here is the CPU: at "
      f"{args.preset or GPU_DEFAULTS['preset']} it would run for minutes and can run out of memory. For a smoke "
      "run of the script on the CPU, at a small preset: python scripts/gpu_check.py --cpu_smoke (tiny,micro, "
      "2 rounds of 2 steps); on a GPU, install jax for it (pip install -e '.[cuda12]')"
    )
  for name, value in (CPU_SMOKE if args.cpu_smoke else GPU_DEFAULTS).items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  out: dict[str, Any] = {
    "command": " ".join(["python scripts/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]),
    "preset": args.preset,
    "rounds": args.rounds,
    "steps": args.steps,
    "device": str(jax.devices()[0]),
    "device_kind": jax.devices()[0].device_kind,
    "jax": jax.__version__,
    "batch": args.batch or "the preset's",
    "peak_flops": peak_flops(jax.devices()[0].device_kind),
    "sides": {},
  }
  paths = args.paths.split(",")
  if not paths or set(paths) - set(PATHS):
    raise SystemExit(f"--paths: give one or both of {', '.join(PATHS)}, comma-separated; got {args.paths!r}")
  sides = {}
  names = [n + ("" if path == "today" else NEW) for n in side_names(args.sides) for path in paths]
  for name in names:
    try:
      sides[name] = _side(args.preset, name, args.steps, args.hybrid_warmup, args.batch, args.loss_chunk)
      print(f"{name}: compiled; first step {sides[name]['first_step_s']:.1f} s", flush=True)
    except Exception as e:  # noqa: BLE001 (the other sides still run; the error is reported)
      out["sides"][name] = {"error": f"{type(e).__name__}: {e}"}
      traceback.print_exc()
  per_round: dict[str, list[float]] = {name: [] for name in sides}
  kinds: dict[str, collections.Counter] = {name: collections.Counter() for name in sides}
  for r in range(args.rounds):
    for name, side in sides.items():
      times, state = [], side["state"]
      for batch in side["batches"][1:]:
        t0 = time.perf_counter()
        state, metrics = side["driver"].run(state, [batch])
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
        kinds[name][_kind(metrics)] += 1
      side["state"] = state
      per_round[name].append(1e3 * statistics.median(times))
      if hasattr(side["driver"], "flush_trace"):  # as the training loop does at each log
        side["driver"].flush_trace()
    out.setdefault("memory", {})[f"round {r + 1}"] = _memory()
    print(f"round {r + 1}: " + ", ".join(f"{n} {ms[-1]:.1f}" for n, ms in per_round.items()) + " ms/step", flush=True)
  base = statistics.median(per_round["gpt2"]) if per_round.get("gpt2") else None
  for name, ms in per_round.items():
    q1, _, q3 = statistics.quantiles(ms, n=4) if len(ms) > 1 else (ms[0], 0, ms[0])
    side = sides[name]
    tokens_per_s = side["tokens_per_step"] / (statistics.median(ms) / 1e3)
    out["sides"][name] = {
      "params": int(side["params"]),
      "median_ms": statistics.median(ms),
      "iqr_ms": q3 - q1,
      "ratio": statistics.median(ms) / base if base else None,
      "first_step_s": side["first_step_s"],
      "step_kinds": dict(kinds[name]),
      "memory": side["memory"],
      "attention": side["attention"],
      "loss_chunk": side["loss_chunk"],
      "tokens_per_s": tokens_per_s,
      "flops_per_token": side["flops_per_token"],
      "peak_share": tokens_per_s * side["flops_per_token"] / out["peak_flops"] if out["peak_flops"] else None,
      "peak_bytes": side["memory"]["first step"].get("peak_bytes_in_use"),
    }
    s = out["sides"][name]
    today = per_round.get(name.removesuffix(NEW)) if name.endswith(NEW) else None
    if today:
      s["speedup"] = statistics.median(today) / s["median_ms"]
    share = f"{100 * s['peak_share']:.1f}% of peak" if s["peak_share"] is not None else "peak unknown"
    print(
      f"{name:12s} {s['median_ms']:9.2f} ms/step (IQR {s['iqr_ms']:.2f})  x{s['ratio'] or float('nan'):.3f} "
      f"of gpt2  {tokens_per_s:,.0f} tokens/s ({share})  {s['attention']} attention, loss chunk {s['loss_chunk']}  "
      f"kinds {s['step_kinds']}",
      flush=True,
    )
  used = [m["bytes_in_use"] for m in out.get("memory", {}).values()]
  out["growth_bytes"] = used[-1] - used[0] if used else None
  print(f"bytes in use, rounds 1..{len(used)}: {used} (growth {out['growth_bytes']} B)", flush=True)
  text = json.dumps(out, indent=1, default=str)
  if args.json:
    with open(args.json, "w") as f:
      f.write(text)
  print(text)
  return out


if __name__ == "__main__":
  main()
