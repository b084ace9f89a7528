"""Per-step time of `loop.train.train` on a mesh of N simulated CPU devices (or the real devices).

  .venv/bin/python scripts/bench_mesh.py --devices 1
  .venv/bin/python scripts/bench_mesh.py --devices 8 [--fsdp 2] [--mode hybrid] [--preset tiny]

With `--devices N` on CPU, XLA simulates N devices in this process
(`--xla_force_host_platform_device_count`, set before JAX starts). On a 2-core machine that measures
the cost of the sharded programs (collectives, per-device dispatch), not a speed-up: the N devices
share the same cores. `--devices 0` uses whatever devices JAX finds (GPUs). The last line is
`ms_per_step=<train time / timed steps, compile excluded>`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--devices", type=int, default=8, help="simulated CPU devices; 0 = real devices")
  ap.add_argument("--fsdp", type=int, default=1, help="config.mesh.fsdp (data = devices / fsdp)")
  ap.add_argument("--mode", default="baseline", choices=("baseline", "hybrid"))
  ap.add_argument("--preset", default="tiny", help="experiments/configs/gpt2_small.py preset")
  ap.add_argument("--steps", type=int, default=100)
  ap.add_argument("--batch-size", type=int, default=16)
  args = ap.parse_args()
  if args.devices > 0:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    )
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

  import jax

  from experiments import gpt2_small as experiment
  from experiments.configs import gpt2_small as configs

  c = configs.get_config(args.preset)
  c.mode = args.mode
  c.trainer.steps = args.steps
  c.trainer.batch_size = args.batch_size
  c.trainer.log_every = 10
  c.trainer.eval_every = 0
  c.trainer.checkpoint_every = 0
  c.trainer.progress = False
  c.trainer.compile_cache = False
  c.mesh.fsdp = args.fsdp
  with tempfile.TemporaryDirectory() as workdir:
    summary = experiment.run(c, workdir)
  print(
    f"devices={jax.device_count()} mesh={summary['mesh']} mode={args.mode} "
    f"preset={args.preset} batch={args.batch_size} steps={args.steps}"
  )
  if "phase_ms_per_step" in summary:
    print(f"phase_ms_per_step={summary['phase_ms_per_step']}")
  print(f"ms_per_step={1e3 * summary['s_per_step']:.2f}")


if __name__ == "__main__":
  main()
