"""Scale-out with `jax.sharding`: the device mesh, and where every part of the training state lives.

The mesh has two axes, `data` x `fsdp` (config block `mesh`, see `config.default_mesh_config`):

  batch        dim 0 split over every device (both axes): `fsdp` is data parallelism too, whose
               replicas also split the weights, so its devices must not repeat each other's rows
  params,      FSDP: each leaf split over the `fsdp` axis on its largest dimension that `fsdp`
  opt_state,   divides, replicated where none does (and everywhere when fsdp = 1); the choice
  params-sized depends only on the leaf's shape, so optimizer-state leaves that mirror params get
  buffers      exactly the param's sharding, and scalars (counts, hyperparameters) are replicated;
               a method's params-sized buffers (e.g. the velocity) are laid out so too, as its
               `shardings` says
  the rest     a method's small state (RSSM, corrector, history), the controller and rng: replicated
               (they are small, and every device needs all of them every step)

The jitted steps take and return the state with these shardings (`step_jit_kwargs`) and still
donate it, so buffers are reused in place on every device. On a one-device mesh nothing here is
applied: the trainer then runs exactly the single-device programs, bit for bit.

Multi-host: `initialize_distributed(config)` calls `jax.distributed.initialize()` when
`config.distributed.enabled`; after it, `jax.devices()` lists every host's devices and the same
mesh code spans them. Every process computes the same global batch (batches are deterministic in
(seed, step)) and `shard_batch` keeps only the rows its own devices hold.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hybridjax import config as config_lib
from hybridjax import schema

try:  # Auto axes: shardings are given at the jit boundary and propagated inside by XLA
  _AUTO_AXES = {"axis_types": (jax.sharding.AxisType.Auto,) * 2}
except AttributeError:  # pragma: no cover - older jax, where every mesh axis is automatic
  _AUTO_AXES = {}

DATA, FSDP = "data", "fsdp"
AXES = (DATA, FSDP)


# --- mesh -----------------------------------------------------------------------------------------


def make_mesh(config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The (data, fsdp) mesh that `config.mesh` names, over `devices` (default: all, every host).

  Raises:
    ValueError: naming `mesh.data`, `mesh.fsdp` or `trainer.batch_size` when the shape does not
      cover the devices exactly or the batch does not split evenly (see `config.mesh_shape`).
  """
  devices = list(jax.devices() if devices is None else devices)
  data, fsdp = mesh_shape(config, len(devices))
  # jax.make_mesh orders the devices by the physical topology on TPUs and keeps each host's devices
  # together, so an fsdp axis no larger than a host keeps its every-step all-gathers inside it.
  return jax.make_mesh((data, fsdp), AXES, devices=devices, **_AUTO_AXES)


def is_multi_device(mesh: Mesh | None) -> bool:
  """True when `mesh` spans more than one device; otherwise the sharded paths are skipped."""
  return mesh is not None and mesh.size > 1


def describe(mesh: Mesh) -> dict[str, Any]:
  """JSON-able facts about `mesh` for logs and summaries."""
  return {
    "data": int(mesh.shape[DATA]),
    "fsdp": int(mesh.shape[FSDP]),
    "devices": int(mesh.size),
    "processes": jax.process_count(),
    "platform": mesh.devices.flat[0].platform,
  }


# --- shardings ------------------------------------------------------------------------------------


def replicated(mesh: Mesh) -> NamedSharding:
  """A full copy on every device of `mesh`."""
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Dim 0 (the batch) split over every device of `mesh`; other dims whole."""
  return NamedSharding(mesh, P(AXES))  # the batch is split over both axes (see the module docstring)


def fsdp_spec(shape: Sequence[int], fsdp_size: int) -> P:
  """The PartitionSpec of one FSDP-sharded leaf of `shape` on an fsdp axis of `fsdp_size`.

  The largest dimension that `fsdp_size` divides is split (the first of equal ones); a leaf with no
  such dimension, a scalar, or any leaf when `fsdp_size` is 1 is replicated. Taking the largest
  *divisible* dimension, not only the largest, still shards e.g. a (50257, 768) embedding on 768.
  """
  if fsdp_size <= 1:
    return P()
  for dim in sorted(range(len(shape)), key=lambda i: (-shape[i], i)):
    if shape[dim] % fsdp_size == 0:
      return P(*([None] * dim + [FSDP]))
  return P()


def fsdp_sharding(abstract_tree: Any, mesh: Mesh) -> Any:
  """A tree of NamedSharding for `abstract_tree` (arrays or ShapeDtypeStructs), FSDP-style.

  Pure in the leaves' shapes and the mesh; see `fsdp_spec`.
  """
  n = int(mesh.shape[FSDP])
  return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), n)), abstract_tree)


def replicated_tree(abstract_tree: Any, mesh: Mesh) -> Any:
  """A tree of the replicated sharding, one per leaf of `abstract_tree`."""
  rep = replicated(mesh)
  return jax.tree.map(lambda _: rep, abstract_tree)


def train_state_shardings(abstract_state: Any, mesh: Mesh) -> Any:
  """Shardings of a `optim.TrainState`: params, optimizer state and params average FSDP, the rest
  (the step, counters, the average's beta) replicated."""
  rest = replicated_tree(abstract_state, mesh)
  out = rest.replace(
    params=fsdp_sharding(abstract_state.params, mesh), opt_state=fsdp_sharding(abstract_state.opt_state, mesh)
  )
  if abstract_state.averaging is not None:  # the params average is laid out like the params
    out = out.replace(averaging=rest.averaging.replace(params=fsdp_sharding(abstract_state.averaging.params, mesh)))
  if abstract_state.outer is not None:  # so are outer momentum's two buffers
    o = abstract_state.outer
    out = out.replace(
      outer=rest.outer.replace(slow=fsdp_sharding(o.slow, mesh), momentum=fsdp_sharding(o.momentum, mesh))
    )
  return out


def hybrid_state_shardings(abstract_state: Any, mesh: Mesh, method: Any) -> Any:
  """Shardings of a `hybrid.state.HybridState`: the train state FSDP, the controller and rng
  replicated, and the method's own state as its `shardings(state, like_params, replicated)` says;
  a method that says nothing gets every params-shaped subtree of its state laid out like the params
  (FSDP) and the rest replicated."""
  rest = replicated_tree(abstract_state, mesh)
  out = rest.replace(train=train_state_shardings(abstract_state.train, mesh))
  if abstract_state.method is None:
    return out

  like_params = functools.partial(fsdp_sharding, mesh=mesh)
  replicated = functools.partial(replicated_tree, mesh=mesh)
  if method.shardings is not None:
    return out.replace(method=method.shardings(abstract_state.method, like_params, replicated))
  params = abstract_state.train.params
  params_def = jax.tree.structure(params)
  shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]

  def params_shaped(tree: Any) -> bool:
    return jax.tree.structure(tree) == params_def and [tuple(x.shape) for x in jax.tree.leaves(tree)] == shapes

  layout = jax.tree.map(
    lambda sub: like_params(sub) if params_shaped(sub) else replicated(sub),
    abstract_state.method,
    is_leaf=params_shaped,
  )
  return out.replace(method=layout)


def step_jit_kwargs(state_shardings: Any, mesh: Mesh | None) -> dict[str, Any]:
  """`jax.jit` keyword arguments for a `(state, batch, schedule) -> (state, metrics)` step on `mesh`.

  The state comes in and goes out with `state_shardings` (so a donated buffer can be reused in
  place on its device), every batch leaf is split on dim 0, the schedule's scalars are replicated,
  and the metrics come back replicated (so any host can read them). Empty on a one-device mesh:
  plain `jax.jit` there.
  """
  if not is_multi_device(mesh):
    return {}
  return {
    "in_shardings": (state_shardings, batch_sharding(mesh), replicated(mesh)),
    "out_shardings": (state_shardings, replicated(mesh)),
  }


def restore_target(abstract_state: Any, shardings: Any | None) -> Any:
  """`abstract_state` as ShapeDtypeStructs that carry the shardings to restore onto.

  A checkpoint is restored onto these shardings whatever mesh it was saved from. With `shardings`
  None (one device), every leaf goes to the default device.
  """
  if shardings is None:
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: one, abstract_state)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings)


# --- batches --------------------------------------------------------------------------------------


def _check_batch_leaf(path: Any, x: Any, mesh: Mesh) -> None:
  n = mesh.size
  if np.ndim(x) == 0 or np.shape(x)[0] % n:
    name = jax.tree_util.keystr(path)
    raise ValueError(
      f"batch leaf {name} has shape {np.shape(x)}: its dim 0 must be a multiple of the {n} "
      f"devices of the mesh (mesh.data x mesh.fsdp); set --config.trainer.batch_size to a "
      f"multiple of {n}"
    )


def shard_batch(batch: Mapping[str, Any], mesh: Mesh | None) -> Any:
  """The global `batch` (host arrays, the same on every process) as arrays split on dim 0.

  Each process reads only the rows its own devices hold (`jax.make_array_from_callback`), so this
  is also the multi-host path. On a one-device mesh the batch is returned unchanged.
  """
  if not is_multi_device(mesh):
    return batch
  sharding = batch_sharding(mesh)

  def put(path, x):
    if isinstance(x, jax.Array) and x.sharding == sharding:
      return x
    _check_batch_leaf(path, x, mesh)
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree_util.tree_map_with_path(put, batch)


def shard_local_batch(local_batch: Mapping[str, Any], mesh: Mesh) -> Any:
  """Like `shard_batch`, for a pipeline where each process loads only its own rows.

  `local_batch` holds this process's consecutive share of the global batch (the global batch is
  the processes' shares in process order); `jax.make_array_from_process_local_data` assembles them.
  With one process the local batch is the global batch.
  """
  sharding = batch_sharding(mesh)
  n_proc = jax.process_count()

  def put(path, x):
    x = np.asarray(x)
    global_shape = (x.shape[0] * n_proc,) + x.shape[1:] if x.ndim else x.shape
    _check_batch_leaf(path, np.empty(global_shape, np.int8), mesh)
    return jax.make_array_from_process_local_data(sharding, x, global_shape)

  return jax.tree_util.tree_map_with_path(put, local_batch)


# --- multi-host -----------------------------------------------------------------------------------


def initialize_distributed(config: ml_collections.ConfigDict) -> bool:
  """Calls `jax.distributed.initialize()` if `config.distributed.enabled`; True if it is running.

  Call it first, before anything touches JAX devices (`experiments/gpt2_small.py` does; so does
  `trainer.train`, which is then a no-op). Empty fields are auto-detected by JAX (SLURM, Open MPI,
  TPU pods, ...). Calling it again is harmless.
  """
  dist = config.get("distributed")
  if dist is None or not dist.get("enabled", False):
    return False
  if jax.distributed.is_initialized():
    return True
  auto = {"coordinator_address": "", "num_processes": 0, "process_id": -1}  # the values JAX auto-detects
  kwargs = {k: dist[k] for k, v in auto.items() if dist.get(k, v) != v}
  try:
    jax.distributed.initialize(**kwargs)
  except RuntimeError as e:
    raise RuntimeError(
      f"--config.distributed.enabled: jax.distributed.initialize({kwargs}) failed: {e}\n"
      "Call hybridjax.sharding.initialize_distributed(config) before anything uses JAX devices "
      "(jax.devices(), jax.random, building params), and check the coordinator address and "
      "process ids."
    ) from e
  return True


# --- the mesh a config asks for ---------------------------------------------------------------


def mesh_errors(config: ml_collections.ConfigDict, n_devices: int | None) -> tuple[list[str], int, int]:
  """(errors, data, fsdp) for `config.mesh` on `n_devices` devices (None: not known yet).

  Validation runs before JAX starts (multi-host start-up must come first), so it checks only what
  the config alone decides; `mesh_shape` repeats the checks with the real device count.
  """
  mesh = config.get("mesh") or config_lib.default_mesh_config()
  data, fsdp = mesh.get("data", -1), mesh.get("fsdp", 1)
  if data == 0:
    return ["--config.mesh.data must be >= 1, or -1 for all devices, got 0"], data, fsdp
  if n_devices is not None:
    if data == -1:
      if n_devices % fsdp:
        return (
          [
            f"--config.mesh.fsdp ({fsdp}) must divide the number of devices "
            f"({n_devices}); set --config.mesh.fsdp to a divisor of {n_devices}"
          ],
          data,
          fsdp,
        )
      data = n_devices // fsdp
    elif data * fsdp != n_devices:
      return (
        [
          f"--config.mesh.data ({data}) x --config.mesh.fsdp ({fsdp}) = {data * fsdp} must equal "
          f"the number of devices ({n_devices}); set --config.mesh.data=-1 to use them all"
        ],
        data,
        fsdp,
      )
  errors = []
  if data > 0 and "trainer" in config:
    t = config.trainer
    n = data * fsdp * t.grad_accum
    if t.batch_size % n:
      errors.append(
        f"--config.trainer.batch_size ({t.batch_size}) must be divisible by mesh.data ({data}) x "
        f"mesh.fsdp ({fsdp}) x trainer.grad_accum ({t.grad_accum}) = {n}, so every device gets "
        f"an equal share of each micro-batch; use a multiple of {n}"
      )
  dist = config.get("distributed")
  if dist is not None:
    address, enabled = dist.get("coordinator_address", ""), dist.get("enabled", False)
    n_proc, proc_id = dist.get("num_processes", 0), dist.get("process_id", -1)
    if address and not enabled:
      errors.append(
        "--config.distributed.coordinator_address is set but "
        "--config.distributed.enabled is False; set it to True for a multi-host run"
      )
    if n_proc > 0 and proc_id >= n_proc:
      errors.append(
        f"--config.distributed.process_id ({proc_id}) must be < --config.distributed.num_processes ({n_proc})"
      )
  return errors, data, fsdp


def mesh_shape(config: ml_collections.ConfigDict, n_devices: int) -> tuple[int, int]:
  """The (data, fsdp) mesh shape `config.mesh` asks for on `n_devices` devices.

  Raises:
    ValueError: naming the field and the fix, when the shape does not cover exactly `n_devices`
      devices or `trainer.batch_size` does not split evenly over them.
  """
  errors, data, fsdp = mesh_errors(config, n_devices)
  schema.raise_invalid(errors)
  return data, fsdp
