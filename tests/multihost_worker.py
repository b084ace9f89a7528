"""One process of the two-process check in tests/test_sharding.py (not a test module itself).

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/multihost_worker.py ID PORT WORKDIR

Joins the other process through `hybridjax.sharding.initialize_distributed` (config block
`distributed`: coordinator localhost:PORT, 2 processes, this one ID), trains the baseline on the
test MLP over a 4x2 mesh of both processes' 8 CPU devices with `loop.train.train`, and prints one
JSON line of facts. Both processes compute the same global batch; each places only its own rows.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # conftest
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # hybridjax

STEPS = 6


def config(steps: int = STEPS):
  from conftest import micro_config

  c = micro_config("baseline", steps=steps)
  c.trainer.update(batch_size=32, eval_batches=1)  # what task() gives
  c.trainer.log_every = 2
  return c


def init_params(rng):
  import jax.numpy as jnp

  from hybridjax.models import mlp

  return mlp.MLP(features=(16, 16), n_out=1).init(rng, jnp.zeros((1, 4)))["params"]


def task() -> dict:
  """`loop.train.train` keyword arguments for the test MLP (the same on every process)."""
  from hybridjax.models import mlp

  x, y = mlp.make_regression_problem(0, n_in=4)
  batch = lambda i: mlp.regression_batch(x, y, step=i, batch_size=32, seed=0)  # noqa: E731
  loss_fn = mlp.make_loss_fn(mlp.MLP(features=(16, 16), n_out=1))
  return dict(init_params=init_params, loss_fn=loss_fn, train_batch=batch, eval_batches=[batch(10_000)])


def main(process_id: int, port: int, workdir: str) -> None:
  from hybridjax import sharding as sh

  c = config()
  c.distributed.enabled = True
  c.distributed.coordinator_address = f"localhost:{port}"
  c.distributed.num_processes = 2
  c.distributed.process_id = process_id
  c.mesh.data, c.mesh.fsdp = 4, 2
  assert sh.initialize_distributed(c)  # first, before anything touches JAX devices
  import jax

  from hybridjax.loop import train as train_lib

  summary = train_lib.train(c, workdir, **task())
  print(
    json.dumps(
      {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "mesh": summary["mesh"],
        "final_eval_loss": summary["final_eval_loss"],
      }
    )
  )
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
