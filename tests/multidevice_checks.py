"""The 8-device checks of `hybridjax.sharding`; tests/test_sharding.py runs them in a subprocess.

The device count is fixed when JAX starts (XLA_FLAGS=--xla_force_host_platform_device_count=8) and
the rest of the suite runs on one device, so this module runs in its own process:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice_checks.py

(its name keeps the main run from collecting it). Everything uses the small MLP and the
fast-cycling hybrid config of tests/conftest.py (`STD`), and one driver per mesh shape: compiling the
three step kinds per mesh dominates the run time, so the tests share them (and `_reference_runs`).
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import shutil
import tempfile
import time
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import STD, micro_config, small_hybrid_config
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hybridjax import checkpoint as ckpt_lib
from hybridjax import memory as memory_lib
from hybridjax import optim
from hybridjax import sharding as sh
from hybridjax.hybrid.phases import Phase
from hybridjax.loop import drivers
from hybridjax.loop import train as train_lib
from hybridjax.models import mlp

pytestmark = pytest.mark.skipif(
  jax.device_count() != 8,
  reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/test_sharding.py sets it)",
)

TOTAL_STEPS = 200
RUN_STEPS, SAVE_AT = 30, 15
MESHES = {"1": (1, 1), "8x1": (8, 1), "4x2": (4, 2)}
# Different meshes sum the loss and the gradients in different orders: float32 rounding only.
TOL = dict(rtol=1e-4, atol=1e-6)

MODEL = mlp.MLP(features=(16, 16), n_out=1)
X, Y = mlp.make_regression_problem(0, n_in=4)
LOSS_FN = mlp.make_loss_fn(MODEL)


def init_params(rng):
  return MODEL.init(rng, jnp.zeros((1, 4)))["params"]


def batch(i):
  return mlp.regression_batch(X, Y, step=i, batch_size=32, seed=0)


def config(mode="hybrid", data=-1, fsdp=1, steps=TOTAL_STEPS):
  c = micro_config(mode, steps=steps)
  c.hybrid = small_hybrid_config(**STD)
  c.trainer.update(batch_size=32, eval_batches=1)  # the MLP's batches, one held out
  c.mesh.data, c.mesh.fsdp = data, fsdp
  return c


TX = optim.make_optimizer(config().optim)


@functools.cache
def driver(name):
  """(HybridDriver, mesh) for one of MESHES, over the first data x fsdp devices."""
  d, f = MESHES[name]
  c = config(data=d, fsdp=f)
  mesh = sh.make_mesh(c, jax.devices()[: d * f])
  drv = drivers.HybridDriver(
    c,
    loss_fn=LOSS_FN,
    tx=TX,
    rng=jax.random.PRNGKey(1),
    init_params=lambda: init_params(jax.random.PRNGKey(0)),
    mesh=mesh,
  )
  return drv, mesh


def _step(drv, state, b):
  state, m = drv.run(state, [b])
  return state, m


def _drain(drv, state, m):
  """Empties the per-step trace and readings the driver keeps for the logs, as a log would."""
  drv.records(jax.device_get(m), drv.log_view(state))


def run(name, state, start, n, on_step=None):
  """n hybrid steps from batch `start` through the driver; returns (state, phases, s/step)."""
  drv, mesh = driver(name)
  phases, seconds = [], []
  for i in range(start, start + n):
    t0 = time.perf_counter()
    state, m = _step(drv, state, sh.shard_batch(batch(i), mesh))
    phases.append(int(m["phase"]))  # waits for the step
    seconds.append(time.perf_counter() - t0)
    if on_step is not None:
      on_step(i + 1, state)
  jax.block_until_ready(state)
  _drain(drv, state, m)
  return state, phases, float(np.median(seconds[1:]))  # the first call compiles


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


@functools.cache
def _reference_runs():
  """30 hybrid steps on each mesh from the same init; the 4x2 run saves a checkpoint at step 15."""
  out = {"ckpt_dir": tempfile.mkdtemp(prefix="hybridjax_mesh_ckpt_")}
  atexit.register(shutil.rmtree, out["ckpt_dir"], True)
  manager = ckpt_lib.make_manager(out["ckpt_dir"])

  def save_at(step, state):
    if step == SAVE_AT:
      ckpt_lib.save(manager, step, state, {"step": step})
      manager.wait_until_finished()

  for name in MESHES:
    drv, _ = driver(name)
    state, phases, s_per_step = run(name, drv.init_state(), 0, RUN_STEPS, on_step=save_at if name == "4x2" else None)
    out[name] = {
      "state": state,
      "train": _host(state.train),
      "velocity": _host(state.method.velocity),
      "phases": phases,
      "ms": 1e3 * s_per_step,
    }
  manager.close()
  print(
    "\nper-step time (median of 29 hybrid steps of the test MLP, after compile): "
    + ", ".join(f"mesh {n}: {out[n]['ms']:.2f} ms" for n in MESHES)
  )
  return out


# --- the checks -----------------------------------------------------------------------------------


def test_default_mesh_is_data_parallel_over_all_devices():
  mesh = sh.make_mesh(config())
  assert dict(mesh.shape) == {"data": 8, "fsdp": 1}
  assert sorted(d.id for d in mesh.devices.flat) == list(range(8))
  with pytest.raises(ValueError, match="mesh.data"):
    sh.make_mesh(config(data=3))
  with pytest.raises(ValueError, match="mesh.fsdp"):
    sh.make_mesh(config(fsdp=3))
  bad = config()
  bad.trainer.batch_size = 36
  with pytest.raises(ValueError, match="trainer.batch_size"):
    sh.make_mesh(bad)


def test_same_params_and_phases_on_1_8x1_and_4x2_devices():
  runs = _reference_runs()
  ref = runs["1"]
  assert set(ref["phases"]) == set(Phase), ref["phases"]
  for name in ("8x1", "4x2"):
    assert runs[name]["phases"] == ref["phases"], name
    chex.assert_trees_all_close(runs[name]["train"].params, ref["train"].params, **TOL)
    chex.assert_trees_all_close(runs[name]["train"].opt_state, ref["train"].opt_state, **TOL)
    chex.assert_trees_all_close(runs[name]["velocity"], ref["velocity"], **TOL)
  # Not vacuous: the params moved well beyond the tolerance.
  moved = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(jax.tree.leaves(ref["train"].params), jax.tree.leaves(init_params(jax.random.PRNGKey(0))))
  )
  assert moved > 1e-2, moved


# Expected FSDP layout of the MLP on the 4x2 mesh: spec and per-device shard shape.
FSDP_LAYOUT = {
  "dense_0/kernel": (P(None, "fsdp"), (4, 8)),  # (4, 16): 16 is the largest dim
  "dense_0/bias": (P("fsdp"), (8,)),
  "dense_1/kernel": (P("fsdp"), (8, 16)),  # (16, 16): the first of equal dims
  "dense_1/bias": (P("fsdp"), (8,)),
  "out/kernel": (P("fsdp"), (8, 1)),  # (16, 1)
  "out/bias": (P(), (1,)),  # (1,): 2 does not divide 1, so replicated
}


def _name(path):
  return "/".join(str(getattr(k, "key", k)) for k in path)


def test_params_optimizer_state_and_velocity_are_fsdp_sharded():
  state = _reference_runs()["4x2"]["state"]
  _, mesh = driver("4x2")
  flat = {_name(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(state.train.params)}
  assert set(flat) == set(FSDP_LAYOUT)
  for name, (spec, shard_shape) in FSDP_LAYOUT.items():
    leaf = flat[name]
    assert isinstance(leaf.sharding, NamedSharding) and leaf.sharding.mesh == mesh, name
    assert leaf.sharding.spec == spec, (name, leaf.sharding.spec)
    shards = leaf.addressable_shards
    assert len(shards) == 8 and {s.device.id for s in shards} == set(range(8)), name
    assert all(s.data.shape == shard_shape for s in shards), (name, [s.data.shape for s in shards])
    full = np.asarray(leaf)
    for s in shards:  # each device holds exactly its slice
      np.testing.assert_array_equal(np.asarray(s.data), full[s.index])
    if spec != P():  # the two devices of an fsdp pair hold different halves
      a, b = (s for s in shards if s.device in set(mesh.devices[0]))
      assert a.index != b.index, name
  # Velocity and the Adam moments (the optimizer-state subtrees shaped like the params) mirror the
  # params' shardings; the optimizer's other leaves are scalars (counts, hyperparameters), replicated.
  params_def = jax.tree.structure(state.train.params)
  like_params = lambda n: jax.tree.structure(n) == params_def  # noqa: E731
  nodes = jax.tree.leaves(state.train.opt_state, is_leaf=like_params)
  mirrors = [n for n in nodes if like_params(n)] + [state.method.velocity]
  assert len(mirrors) >= 3, "expected Adam's mu and nu and the velocity"
  for tree in mirrors:
    for p_leaf, m_leaf in zip(jax.tree.leaves(state.train.params), jax.tree.leaves(tree)):
      assert m_leaf.sharding == p_leaf.sharding
  for n in nodes:
    if not like_params(n):
      assert n.ndim == 0 and n.sharding.is_fully_replicated, n
  # The RSSM, corrector, ring buffers, controller and rng are replicated on every device.
  m = state.method
  for part in (m.dynamics, m.corrector, m.history, m.plan, state.controller, state.rng):
    for leaf in jax.tree.leaves(part):
      assert leaf.sharding.is_fully_replicated and len(leaf.addressable_shards) == 8
  # Per device, the params take their replicated leaves plus half of each sharded one.
  dev0 = mesh.devices.flat[0]
  on_dev0 = sum(s.data.nbytes for leaf in flat.values() for s in leaf.addressable_shards if s.device == dev0)
  expected = sum(leaf.nbytes // (1 if FSDP_LAYOUT[n][0] == P() else 2) for n, leaf in flat.items())
  assert on_dev0 == expected < sum(leaf.nbytes for leaf in flat.values())
  # The compiled step (the fused one the reference runs ran, from the compilation caches) takes and
  # returns the state with these shardings, and the batch split.
  drv, _ = driver("4x2")
  assert drv.dispatch == "switch"
  leaves, want = jax.tree.leaves(state), jax.tree.leaves(drv.state_shardings)
  compiled = drv._fused.lower(state, sh.shard_batch(batch(0), mesh), drv.schedule).compile()
  for fn in (compiled,):
    (state_in, batch_in, _), _ = fn.input_shardings
    state_out, metrics_out = fn.output_shardings
    for got in (jax.tree.leaves(state_in), jax.tree.leaves(state_out)):
      assert len(got) == len(want)
      assert all(g.is_equivalent_to(w, x.ndim) for g, w, x in zip(got, want, leaves))
    assert all(b.is_equivalent_to(sh.batch_sharding(mesh), 2) for b in jax.tree.leaves(batch_in))
    assert all(m.is_fully_replicated for m in jax.tree.leaves(metrics_out))
  # On the 8x1 mesh nothing is split.
  for leaf in jax.tree.leaves(_reference_runs()["8x1"]["state"].train.params):
    assert leaf.sharding.is_fully_replicated


def test_batches_are_split_over_every_device():
  _, mesh = driver("4x2")
  host = batch(0)
  placed = sh.shard_batch(host, mesh)
  for key in ("x", "y"):
    arr = placed[key]
    assert arr.sharding == sh.batch_sharding(mesh)
    assert sorted(s.data.shape[0] for s in arr.addressable_shards) == [4] * 8
    np.testing.assert_array_equal(np.asarray(arr), host[key])
  # The per-process path: with one process, its local rows are the whole batch.
  local = sh.shard_local_batch(host, mesh)
  assert jax.process_count() == 1
  chex.assert_trees_all_equal(jax.device_get(local), jax.device_get(placed))
  assert local["x"].sharding == placed["x"].sharding
  with pytest.raises(ValueError, match="trainer.batch_size"):
    sh.shard_batch({"x": np.zeros((12, 4), np.float32)}, mesh)


def test_checkpoint_from_4x2_restores_on_8x1_and_1_device_and_continues_identically():
  runs = _reference_runs()
  ref = runs["4x2"]
  manager = ckpt_lib.make_manager(runs["ckpt_dir"])
  try:
    for name in ("8x1", "1"):
      drv, mesh = driver(name)
      target = sh.restore_target(jax.eval_shape(drv.init_state), drv.state_shardings)
      state, meta = ckpt_lib.restore(manager, SAVE_AT, target)
      assert meta["step"] == SAVE_AT and int(state.train.step) == SAVE_AT
      for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(target)):
        assert leaf.sharding.is_equivalent_to(want.sharding, leaf.ndim), name
      state, phases, _ = run(name, state, SAVE_AT, RUN_STEPS - SAVE_AT)
      assert phases == ref["phases"][SAVE_AT:], name
      chex.assert_trees_all_close(_host(state.train.params), ref["train"].params, **TOL)
      chex.assert_trees_all_close(_host(state.method.velocity), ref["velocity"], **TOL)
      c, c_ref = jax.device_get((state.controller, ref["state"].controller))
      np.testing.assert_array_equal(c.phase_steps, c_ref.phase_steps)
      assert int(c.backward_passes) == int(c_ref.backward_passes)
  finally:
    manager.close()


def test_per_device_live_bytes_are_flat_on_the_mesh():
  drv, mesh = driver("4x2")
  state = drv.init_state()
  phases, readings = set(), {}
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(1, 201):
      old = jax.tree.leaves(state) if i <= 40 else []
      state, m = _step(drv, state, sh.shard_batch(batch(i), mesh))
      phases.add(int(m["phase"]))
      # Donation on the mesh: every step kind consumes its whole input state.
      kept = [k for k, leaf in enumerate(old) if not leaf.is_deleted()]
      assert not kept, f"step {i}: donated leaves {kept} were not consumed"
      del old
      if i in (20, 200):
        jax.block_until_ready(state)
        _drain(drv, state, m)
        gc.collect()
        readings[i] = memory_lib.live_bytes_by_device()
  assert not [w for w in caught if "donated buffers were not usable" in str(w.message)]
  assert phases == {0, 1, 2, 3}, phases
  print(f"\nper-device live bytes on the 4x2 mesh @20 {readings[20]}, @200 {readings[200]}")
  assert len(readings[20]) == 8 and min(readings[20].values()) > 0
  assert readings[20] == readings[200], readings
  snap = memory_lib.memory_snapshot()
  assert snap["devices"] == 8 and snap["bytes_in_use"] == snap["device_live_bytes"]
  assert snap["device_live_bytes"] == max(memory_lib.live_bytes_by_device().values())


def test_trainer_runs_on_a_mesh_and_resumes_on_another(tmp_path):
  # trainer.train builds the mesh from the config; a run saved on 4x2 resumes on 8x1 and ends
  # where the uninterrupted 4x2 run ends. The params average is sharded like the params.
  kw = dict(init_params=init_params, loss_fn=LOSS_FN, train_batch=batch, eval_batches=[batch(10_000)])

  def config_avg(**kwargs):
    c = config("baseline", steps=20, **kwargs)
    c.trainer.update(averaging="ema", averaging_beta=0.9)
    return c

  c = config_avg(data=4, fsdp=2)
  c.trainer.checkpoint_every = 10
  drv = train_lib.make_driver(c, init_params=init_params, loss_fn=LOSS_FN, mesh=sh.make_mesh(c))
  live = drv.init_state()
  for p_leaf, a_leaf in zip(jax.tree.leaves(live.params), jax.tree.leaves(live.averaging.params)):
    assert a_leaf.sharding == p_leaf.sharding
  assert any(not leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(live.averaging.params))
  del live, drv
  summary = train_lib.train(c, str(tmp_path / "a"), **kw)
  assert summary["mesh"]["data"] == 4 and summary["mesh"]["fsdp"] == 2
  assert summary["memory"]["source"].startswith("jax.live_arrays (max over 8 devices)")
  os.makedirs(tmp_path / "b" / "checkpoints")
  shutil.copytree(tmp_path / "a" / "checkpoints" / "10", tmp_path / "b" / "checkpoints" / "10")
  resumed = train_lib.train(config_avg(data=8, fsdp=1), str(tmp_path / "b"), **kw)
  assert resumed["start_step"] == 10 and resumed["mesh"]["data"] == 8

  def final(workdir):
    manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"))
    abstract = jax.eval_shape(
      lambda: optim.init_train_state(init_params(jax.random.PRNGKey(0)), optim.make_optimizer(c.optim), 0.9)
    )
    state, _ = ckpt_lib.restore(manager, 20, sh.restore_target(abstract, None))
    manager.close()
    return _host((state.params, state.averaging.params))

  chex.assert_trees_all_close(final(tmp_path / "b"), final(tmp_path / "a"), **TOL)
  assert abs(summary["final_eval_loss"] - resumed["final_eval_loss"]) < 1e-4
  assert summary["final_eval_loss"] == summary["final_eval_loss_averaged"] != summary["final_eval_loss_raw"]
