"""The numerics of every built-in method, recorded so a refactor can prove it changed none of them.

Each built-in method trains the `tiny,micro` GPT-2 for 300 steps through `train()` on a config that
visits each of its phases; the record keeps every logged training loss, the final eval loss and a
checksum of the final params (as the float32 bits, summed per leaf). `tests/methods/test_numerics.py`
re-runs them and compares with `tests/data/method_numerics.json`.

  python scripts/method_numerics.py --write     # re-record (only when numerics are meant to change)
  python scripts/method_numerics.py             # compare with the record, print the differences
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

# The test suite's XLA settings (tests/conftest.py): the record must hold under them.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0")

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "tests", "data", "method_numerics.json")
STEPS = 300


def method_configs() -> dict[str, Any]:
  """One `tiny,micro` hybrid config per built-in method (and the baseline), each short-cycled so
  that its predicted and corrective phases run within `STEPS`."""
  from experiments.configs import gpt2_small

  def base(mode: str):
    c = gpt2_small.get_config("tiny,micro")
    c.mode = mode
    c.trainer.update(
      steps=STEPS, log_every=1, eval_every=0, eval_batches=2, checkpoint_every=0, progress=False, compile_cache=False
    )
    return c

  configs = {"baseline": base("baseline")}
  v = base("hybrid")
  v.hybrid.update(method="velocity", warmup_steps=20, full_steps=5, confidence_threshold=0.0, max_predict_steps=4)
  v.hybrid.velocity.rssm.update(deter=32, latent=8, hidden=32, ensemble=2)
  v.hybrid.velocity.update(history_size=16, window=8)
  configs["velocity"] = v
  j = base("hybrid")
  j.trainer.update(averaging="ema", averaging_beta=0.9)
  j.hybrid.update(method="jump", warmup_steps=10, full_steps=5)
  j.hybrid.health.cooldown_steps = 5
  j.hybrid.jump.update(horizons=(4, 8, 16), every=10, margin=-0.5, stop_fraction=0.8)
  configs["jump"] = j
  jf = base("hybrid")
  jf.trainer.update(averaging="ema", averaging_beta=0.9)
  jf.hybrid.update(method="jump", warmup_steps=10, full_steps=5)
  jf.hybrid.health.cooldown_steps = 5
  jf.hybrid.jump.update(horizons=(4, 8, 16), every=10, margin=-0.5, stop_fraction=0.8, forecast="rssm")
  configs["jump_forecast"] = jf
  o = base("baseline")  # outer momentum runs inside the baseline loop's own step (no hybrid method)
  o.optim.outer_every = 10
  configs["outer_momentum"] = o
  s = base("hybrid")
  s.hybrid.update(method="selective_backprop", warmup_steps=10, full_steps=5)
  configs["selective_backprop"] = s
  return configs


def _checksum(params: Any) -> list[int]:
  """Per leaf (in tree order), the sum of its float32 bit patterns: any changed bit changes it."""
  return [int(np.asarray(x, np.float32).view(np.uint32).astype(np.uint64).sum()) for x in jax.tree.leaves(params)]


def run_method(name: str, config: Any, workdir: str) -> dict[str, Any]:
  """Trains `config` in `workdir`; its losses, final eval loss and params checksum."""
  from experiments import gpt2_small
  from hybridjax import checkpoint as ckpt_lib
  from hybridjax.loop import train as train_lib

  task = gpt2_small.build_task(config)
  summary = train_lib.train(config, workdir, **task.train_kwargs())
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  losses = {str(r["step"]): r["loss"] for r in rows if r.get("kind", "train") == "train" and "loss" in r}
  driver = train_lib.make_driver(config, init_params=task.init_params, loss_fn=task.loss_fn)
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"))
  try:
    state, _ = ckpt_lib.restore(manager, manager.latest_step(), driver.abstract_state())
  finally:
    manager.close()
  # The first TrainState in the driver's state (plain, hybrid or with averaging) holds the params.
  train_state = next(x for x in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, "opt_state")))
  params = train_state.params
  return {
    "method": name,
    "steps": STEPS,
    "final_eval_loss": summary["final_eval_loss"],
    "train_losses": losses,
    "params_checksum": _checksum(jax.device_get(params)),
  }


def record(names: list[str] | None = None) -> dict[str, Any]:
  """Every built-in method's (or `names`') record, trained in a temporary folder."""
  configs = method_configs()
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    for name in names or list(configs):
      out[name] = run_method(name, configs[name], os.path.join(tmp, name))
  return out


def machine() -> dict[str, str]:
  """What decides XLA:CPU's bits besides the code: the jax/jaxlib versions and the CPU (XLA compiles
  for the host's instruction set, so another CPU may round differently)."""
  import jaxlib

  cpu = ""
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      lines = f.read().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("flags")), "")
    cpu += " | " + " ".join(sorted(f for f in flags.split() if f.startswith(("avx", "fma", "sse", "amx"))))
  return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "cpu": cpu}


QUICK_RECORD = os.path.join(ROOT, "tests", "data", "quick_numerics.json")


def quick_numerics(stored: dict[str, Any]) -> dict[str, Any]:
  """What the `quick` protocol computed (its benchmark.json less timings and dates): the anchors'
  budget curves, every tuning run's loss, and each method run's losses and step counts.
  `tests/bench/test_benchmark.py` compares it with `tests/data/quick_numerics.json` (one record per
  machine kind); run that test with HYBRIDJAX_WRITE_NUMERICS=1 to record this machine kind's."""
  return {
    "curves": stored["curves"],
    "tuning": stored["tuning"]["rows"],
    "method_runs": {
      m: {
        s: {k: run[k] for k in ("final_loss", "final_raw", "backward_passes", "step_kinds") if k in run}
        for s, run in runs.items()
      }
      for m, runs in stored["method_runs"].items()
    },
  }


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--write", action="store_true", help="re-record tests/data/method_numerics.json")
  args = parser.parse_args()
  got = record()
  if args.write:
    with open(RECORD, "w") as f:
      json.dump({"machine": machine(), "runs": got}, f, indent=1)
    print(f"wrote {RECORD}")
    return 0
  with open(RECORD) as f:
    want = json.load(f)["runs"]
  bad = [n for n in want if got.get(n) != want[n]]
  print("all bit-identical" if not bad else f"changed: {bad}")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.path.insert(0, ROOT)
  sys.exit(main())
