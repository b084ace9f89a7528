"""Scale-out with `hybridjax.sharding`: mesh config, FSDP layout, multi-device and multi-host runs.

The device count is fixed when JAX starts and this suite runs on one device, so the 8-device checks
(tests/multidevice_checks.py) run in one subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8, and the multi-host check starts two processes
of 4 devices each that meet through `jax.distributed.initialize()`. The rest runs here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import micro_config
from jax.sharding import PartitionSpec as P

from hybridjax import checkpoint as ckpt_lib
from hybridjax import optim, preflight
from hybridjax import sharding as sh
from hybridjax.loop import train as train_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The checks tests/multidevice_checks.py must report as passed.
EIGHT_DEVICE_CHECKS = (
  "test_default_mesh_is_data_parallel_over_all_devices",
  "test_same_params_and_phases_on_1_8x1_and_4x2_devices",
  "test_params_optimizer_state_and_velocity_are_fsdp_sharded",
  "test_batches_are_split_over_every_device",
  "test_checkpoint_from_4x2_restores_on_8x1_and_1_device_and_continues_identically",
  "test_per_device_live_bytes_are_flat_on_the_mesh",
  "test_trainer_runs_on_a_mesh_and_resumes_on_another",
)


def _env(n_devices: int) -> dict[str, str]:
  # Compiling dominates these runs: LLVM at -O0 and the older fusion emitters cut XLA's CPU compile
  # time by about 2.5x. Results are compared only between programs compiled the same way.
  flags = (
    f"--xla_force_host_platform_device_count={n_devices} "
    "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0 "
    "--xla_cpu_use_fusion_emitters=false"
  )
  return dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")


# --- on one device, in this process -----------------------------------------------------------


def _config(**mesh):
  c = micro_config()
  c.trainer.batch_size = 32
  c.mesh.update(mesh)
  return c


def test_mesh_shape_errors_name_the_field():
  assert sh.mesh_shape(_config(), 8) == (8, 1)
  assert sh.mesh_shape(_config(fsdp=2), 8) == (4, 2)
  assert sh.mesh_shape(_config(data=2, fsdp=4), 8) == (2, 4)
  cases = [
    (dict(data=3, fsdp=1), 8, "mesh.data"),  # 3 x 1 != 8 devices
    (dict(data=-1, fsdp=3), 8, "mesh.fsdp"),  # 3 does not divide 8
    (dict(data=0, fsdp=1), 8, "mesh.data"),
    (dict(data=-1, fsdp=1), 3, "trainer.batch_size"),  # 32 rows over 3 devices
  ]
  for mesh, n, field in cases:
    c = _config(**mesh)
    with pytest.raises(ValueError, match=field):
      sh.mesh_shape(c, n)
  c = micro_config()
  c.mesh.data = 0
  with pytest.raises(ValueError, match="mesh.data"):
    preflight.validate(c)  # before JAX starts, what the config alone decides
  c = micro_config()
  c.distributed.coordinator_address = "10.0.0.1:1234"
  with pytest.raises(ValueError, match="distributed.enabled"):
    preflight.validate(c)
  old = micro_config()
  with old.unlocked():
    del old["mesh"]
  assert sh.mesh_shape(old, 2) == (2, 1)  # a config without the block: the defaults


def test_fsdp_spec_takes_the_largest_dimension_that_divides():
  assert sh.fsdp_spec((4, 16), 2) == P(None, "fsdp")
  assert sh.fsdp_spec((16, 16), 2) == P("fsdp")  # the first of equal dims
  assert sh.fsdp_spec((50257, 768), 2) == P(None, "fsdp")  # 50257 is odd: the next largest
  assert sh.fsdp_spec((3, 5), 2) == P()  # nothing divides: replicated
  assert sh.fsdp_spec((), 2) == P()  # scalars: replicated
  assert sh.fsdp_spec((4, 16), 1) == P()  # fsdp off


def test_one_device_is_the_single_device_path():
  mesh = sh.make_mesh(micro_config())
  assert mesh.size == 1 and not sh.is_multi_device(mesh)
  batch = {"x": np.ones((4, 3), np.float32)}
  assert sh.shard_batch(batch, mesh) is batch  # no copy, no placement: the programs are unchanged
  assert sh.step_jit_kwargs(None, mesh) == {}
  assert not sh.initialize_distributed(micro_config())  # off by default: nothing is called


@pytest.mark.slow  # a subprocess that compiles the hybrid step for three meshes: over a minute
def test_eight_simulated_devices(tmp_path):
  xml = tmp_path / "junit.xml"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      "-q",
      "-s",
      "-p",
      "no:xdist",
      "-p",
      "no:cacheprovider",
      os.path.join("tests", "multidevice_checks.py"),
      f"--junitxml={xml}",
    ],
    cwd=ROOT,
    env=_env(8),
    capture_output=True,
    text=True,
    timeout=900,
  )
  for line in r.stdout.splitlines():  # the timings and memory readings, for `pytest -s`
    if "per-step time" in line or "per-device live bytes" in line:
      print(line)
  assert xml.exists(), f"the 8-device run did not finish:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
  outcome = {}
  for case in ET.parse(xml).getroot().iter("testcase"):
    problem = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
    outcome[case.get("name")] = (
      (problem.tag, (problem.get("message") or "") + "\n" + (problem.text or "")[-3000:])
      if problem is not None
      else ("passed", "")
    )
  bad = {n: outcome.get(n, ("not run", "")) for n in EIGHT_DEVICE_CHECKS if outcome.get(n, ("not run",))[0] != "passed"}
  assert not bad, (
    "8-device checks that did not pass:\n"
    + "\n".join(f"--- {n}: {kind}\n{msg}" for n, (kind, msg) in bad.items())
    + f"\n{r.stdout[-2000:]}"
  )


# --- two processes: jax.distributed.initialize -----------------------------------------------------


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_on_one_mesh_and_the_checkpoint_restores_here(tmp_path):
  # Two processes of 4 CPU devices each join through jax.distributed.initialize() (config block
  # `distributed`) into one 4x2 mesh of 8 devices, train the baseline for 6 steps and save one
  # checkpoint together. Here, on one device, the checkpoint restores and equals a local run.
  port, workdir = _free_port(), tmp_path / "multihost"
  worker = os.path.join("tests", "multihost_worker.py")
  procs = [
    subprocess.Popen(
      [sys.executable, worker, str(i), str(port), str(workdir)],
      cwd=ROOT,
      env=_env(4),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outs = []
  try:
    for p in procs:
      outs.append(p.communicate(timeout=300)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for i, (p, out) in enumerate(zip(procs, outs)):
    assert p.returncode == 0, f"process {i} failed:\n{out[-4000:]}"
  facts = [json.loads(next(line for line in out.splitlines() if line.startswith("{"))) for out in outs]
  assert [f["process_index"] for f in facts] == [0, 1]
  assert all(f["process_count"] == 2 and f["device_count"] == 8 and f["local_devices"] == 4 for f in facts)
  assert all(f["mesh"] == {"data": 4, "fsdp": 2, "devices": 8, "processes": 2, "platform": "cpu"} for f in facts)
  assert facts[0]["final_eval_loss"] == facts[1]["final_eval_loss"]
  assert os.path.exists(workdir / "process_1" / "metrics.jsonl")  # logs per process, not mixed

  import multihost_worker as w  # the same task, here on one device

  c = w.config(steps=w.STEPS)
  c.mesh.data = 1
  local = train_lib.train(c, str(tmp_path / "local"), **w.task())
  np.testing.assert_allclose(local["final_eval_loss"], facts[0]["final_eval_loss"], rtol=1e-5)
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"))
  abstract = jax.eval_shape(
    lambda: optim.init_train_state(w.init_params(jax.random.PRNGKey(0)), optim.make_optimizer(c.optim))
  )
  restored, meta = ckpt_lib.restore(manager, w.STEPS, sh.restore_target(abstract, None))
  manager.close()
  manager = ckpt_lib.make_manager(os.path.join(tmp_path, "local", "checkpoints"))
  mine, _ = ckpt_lib.restore(manager, w.STEPS, sh.restore_target(abstract, None))
  manager.close()
  assert meta["step"] == w.STEPS
  chex.assert_trees_all_close(jax.device_get(restored.params), jax.device_get(mine.params), rtol=1e-4, atol=1e-6)
  assert all(
    not jnp.array_equal(a, b)
    for a, b in zip(jax.tree.leaves(mine.params), jax.tree.leaves(w.init_params(jax.random.PRNGKey(0))))
  )
