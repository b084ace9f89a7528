"""The Ray executor: each run of the benchmark a Ray task on a Ray cluster (`pip install -e '.[cluster]'`).

What reaches the workers, and how:

* **The code.** The packages whose source the runs execute, found as the run cache's keys find them
  (`keys.code_packages`: `hybridjax`, with its bundled corpus and tokenizer under `assets/`, and any
  package of a user's task or method), are uploaded once per benchmark as Ray `py_modules`; a
  worker imports them ahead of anything installed on its node. So a run on any node executes the
  source its cache key hashes. The libraries are the node's own: a task checks that their versions
  are the driver's (the key holds those too) and fails, naming them, when one differs.
* **The data.** The bundled corpus travels in the package. A corpus of the user's (`data.path`, a
  file or a folder) is packed by the driver into Ray's object store once per benchmark and unpacked
  once per node (`pack_corpus`, `unpack_corpus`): its file names and bytes, which are all its tokens
  depend on, so the node's copy gives the same tokens; each node tokenizes it into its own
  `HYBRIDJAX_CACHE`.
* **The process.** The driver's `XLA_*` and `JAX_*` variables, with XLA:CPU on one thread
  (`runs.worker_xla_flags`), are the workers' environment from their start, before they import
  jax, exactly as a local worker's: the programs, and so the bits, are the same. A task reserves
  `cpus_per_run` CPUs and `gpus_per_run` GPUs; a share of a GPU (e.g. 0.25) packs several runs on
  one device, each allowed that fraction of its memory (`XLA_PYTHON_CLIENT_MEM_FRACTION`). A run
  with no GPU runs on the CPU (`JAX_PLATFORMS=cpu`).
* **The results.** A task returns its result; only the driver writes the run cache. A method run
  trains in a folder of its node's temporary directory, removed once its result is back.

Faults: a worker that dies (killed, out of memory, its node lost) has its run retried by Ray, up to
`MAX_RETRIES` times, from the start; a run whose code raises fails at once (never retried), with its
spec named; on Ctrl-C or any failure the outstanding tasks are cancelled.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from hybridjax import codehash
from hybridjax.bench.runs import keys as keys_lib
from hybridjax.bench.runs import worker as runs
from hybridjax.bench.runs.executors import Todo, describe, longest_first
from hybridjax.bench.studies import Record

MAX_RETRIES = 3  # a run's retries after its worker died (Ray's default for tasks)
CONNECT_TIMEOUT_S = 10.0  # how long a `ray_address` may take to accept a connection
PROBE_TIMEOUT_S = 60.0  # how long joining the cluster at `ray_address` may take
_ENV_PREFIXES = ("XLA_", "JAX_", "HYBRIDJAX_", "TF_CPP_")


def _import_ray() -> Any:
  try:
    import ray
  except ImportError as e:
    raise ImportError(
      "--config.benchmark.executor=ray needs Ray: pip install -e '.[cluster]' "
      "(or use --config.benchmark.executor=local)"
    ) from e
  return ray


def check_reachable(address: str) -> None:
  """Fails within `CONNECT_TIMEOUT_S` when `address` ('host:port' or 'ray://host:port') accepts no connection:
  `ray.init` itself may wait minutes on an address nothing answers."""
  host, sep, port = address.removeprefix("ray://").rpartition(":")
  if not (sep and port.isdigit()):
    raise ValueError(
      f"benchmark.ray_address={address!r} is not '', 'auto', 'host:port' or 'ray://host:port': give the address "
      "`ray start --head` printed, or '' to start a Ray instance on this machine"
    )
  try:
    with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
      pass
  except OSError as e:
    raise ConnectionError(
      f"benchmark.ray_address={address!r} cannot be reached ({e}): start the cluster (`ray start --head`) "
      "or fix the address; nothing was trained"
    ) from e


def probe(address: str) -> None:
  """Joins the cluster at `address` from a process of its own, which is killed after `PROBE_TIMEOUT_S`:
  `ray.init` may wait without end on a port that accepts connections but never answers as Ray."""
  code = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); ray.shutdown()"
  try:
    done = subprocess.run(
      [sys.executable, "-c", code, address], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
    )
  except subprocess.TimeoutExpired:
    why = f"no Ray cluster answered within {PROBE_TIMEOUT_S:.0f} s"
  else:
    if done.returncode == 0:
      return
    lines = [x for x in done.stderr.strip().splitlines() if x.strip()]
    why = lines[-1] if lines else f"exit status {done.returncode}"
  raise unreachable(address, why)


def unreachable(address: str, why: Any) -> ConnectionError:
  """The refusal of a cluster at `address` that did not answer as Ray (`why`)."""
  return ConnectionError(
    f"benchmark.ray_address={address!r}: {why} (start a cluster with `ray start --head`, or use '' to start Ray on "
    "this machine); nothing was trained"
  )


def corpus_paths(todo: Todo) -> list[str]:
  """The corpora of the user's (`data.path`) that runs in `todo` read."""
  return sorted({str(s["config"].get("data", {}).get("path") or "") for _, s in todo} - {""})


def pack_corpus(path: str) -> bytes:
  """`path` (a text file or a folder), as an uncompressed tar whose one top entry is its base name:
  the names and bytes the corpus's content hash reads, so the tokens a node prepares are the same."""
  root = os.path.abspath(os.path.expanduser(path))
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w") as tar:
    tar.add(root, arcname=os.path.basename(root))
  return buffer.getvalue()


def unpack_corpus(packed: bytes, name: str) -> str:
  """The corpus `packed` on this node (extracted once per content, under the temporary folder): the
  path that stands for `data.path` here."""
  folder = os.path.join(tempfile.gettempdir(), "hybridjax-ray-corpora", hashlib.sha256(packed).hexdigest()[:16])
  if not os.path.isdir(folder):
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    partial = tempfile.mkdtemp(dir=os.path.dirname(folder))  # renamed whole: never read half-written
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r") as tar:
      tar.extractall(partial, filter="data")
    try:
      os.replace(partial, folder)
    except OSError:  # another task on this node extracted it first
      shutil.rmtree(partial, ignore_errors=True)
  return os.path.join(folder, name)


def _task_env(gpus_per_run: float) -> dict[str, str]:
  """The workers' environment: the driver's XLA/JAX/hybridjax variables, XLA:CPU on one thread."""
  env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
  env["XLA_FLAGS"] = runs.worker_xla_flags(os.environ.get("XLA_FLAGS", ""))
  if gpus_per_run == 0:  # a run that reserved no GPU must not take one
    env["JAX_PLATFORMS"] = "cpu"
  elif gpus_per_run < 1:
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.95 * gpus_per_run:.3f}"
  return env


def _run_on_worker(
  spec: Record, key: str, compile_cache_dir: str | None, versions: dict[str, str], corpora: Record
) -> Record:
  """A Ray task: one run, in a temporary folder of this node, on this node's copy of its corpus
  (`corpora`: the driver's `data.path` -> the packed corpus in Ray's object store); its result goes
  back to the driver."""
  found = codehash.installed_versions(list(versions))
  if differ := {lib: (v, found[lib]) for lib, v in versions.items() if found[lib] != v}:
    raise RuntimeError(
      f"node {socket.gethostname()} has other library versions than the driver, (driver, node): {differ}; "
      "install the driver's versions on every node (the run cache keys on them)"
    )
  if compile_cache_dir is not None:
    try:  # the driver's cache folder where this node can write it (a shared filesystem), else none
      os.makedirs(compile_cache_dir, exist_ok=True)
    except OSError:
      compile_cache_dir = None
  runs.enable_cache(compile_cache_dir)
  path = spec["config"].get("data", {}).get("path") or ""
  if path in corpora:
    import ray

    spec = json.loads(json.dumps(spec))  # the driver's spec (and key) unchanged; this run reads the copy
    spec["config"]["data"]["path"] = unpack_corpus(ray.get(corpora[path]), os.path.basename(os.path.abspath(path)))
  run_dir = os.path.join(tempfile.gettempdir(), "hybridjax-ray-runs", key)
  try:
    return runs.execute(spec, run_dir, compile_cache_dir)
  finally:
    shutil.rmtree(run_dir, ignore_errors=True)


class RayExecutor:
  """Each run a Ray task asking for `cpus_per_run` CPUs and `gpus_per_run` GPUs, on the cluster at
  `address` ('' starts a Ray instance on this machine; 'auto' joins the one `ray start` started)."""

  def __init__(
    self,
    address: str,
    *,
    cpus_per_run: float = 1.0,
    gpus_per_run: float = 0.0,
    compile_cache_dir: str | None = None,
    modules: list[str] | tuple[str, ...] = (),
  ):
    """`modules`: every module the protocol's runs may execute (`runner.protocol_modules`): their
    packages are shipped with the first connection, so the phases share it."""
    self.ray = _import_ray()
    if address not in ("", "auto"):
      check_reachable(address)
    if address:
      probe(address)
    self.address = address
    self.cpus_per_run = cpus_per_run
    self.gpus_per_run = gpus_per_run
    self.jax_cache = compile_cache_dir
    self._pending: dict[Any, str] = {}
    self._runtime_env: Record | None = None  # that of the connection, once connected
    self._corpora: Record = {}  # data.path -> the packed corpus in this connection's object store
    self._modules = tuple(modules)
    self.connections = 0  # how many times it joined the cluster: once for a whole protocol

  def _connect(self, runtime_env: Record) -> None:
    """Joins (or starts) the cluster with `runtime_env`, the code and the environment of every
    task: Ray uploads a local package only for the whole connection, so a new set of packages
    (a plug-in's) reconnects."""
    if self._runtime_env == runtime_env:
      return
    self.close()  # the corpora go with the connection's object store
    kwargs: Record = {"include_dashboard": False} if self.address == "" else {}
    try:
      # '' is 'local': a new instance here, never a cluster an earlier `ray start` left recorded.
      self.ray.init(address=self.address or "local", runtime_env=runtime_env, log_to_driver=False, **kwargs)
    except ConnectionError as e:
      raise unreachable(self.address, e) from e
    self._runtime_env = runtime_env
    self.connections += 1

  def map(self, todo: Todo, run_dir: Callable[[str], str]) -> Iterator[tuple[str, Record]]:
    del run_dir  # the driver's folder: a task trains in its own node's temporary folder
    if not todo:
      return
    modules = sorted({m for _, spec in todo for m in keys_lib.spec_modules(spec)} | set(self._modules))
    self._connect({"py_modules": list(keys_lib.code_packages(modules)), "env_vars": _task_env(self.gpus_per_run)})
    versions = codehash.library_versions(modules)
    # A corpus of the user's goes to the object store once per benchmark; each node unpacks it once.
    paths = corpus_paths(todo)
    for path in paths:
      if path not in self._corpora:
        self._corpora[path] = self.ray.put(pack_corpus(path))
    corpora = {path: self._corpora[path] for path in paths}
    remote = self.ray.remote(_run_on_worker).options(
      num_cpus=self.cpus_per_run, num_gpus=self.gpus_per_run, max_retries=MAX_RETRIES, retry_exceptions=False
    )
    specs = dict(todo)
    self._pending = {}
    for key, spec in longest_first(todo):  # each task recorded as it is submitted: Ctrl-C here cancels those
      self._pending[remote.remote(spec, key, self.jax_cache, versions, corpora)] = key
    while self._pending:
      ready, _ = self.ray.wait(list(self._pending), num_returns=1)
      key = self._pending.pop(ready[0])
      try:
        result = self.ray.get(ready[0])
      except self.ray.exceptions.RayError as e:
        cause = getattr(e, "cause", None) or e
        raise RuntimeError(f"the run {describe(specs[key])} (key {key}) failed on the Ray cluster: {cause!r}") from e
      yield key, result

  def close(self, cancel: bool = False) -> None:
    """Cancels the outstanding tasks (after a failure or Ctrl-C) and disconnects; a Ray instance this
    executor started stops with it."""
    if cancel:
      for ref in self._pending:
        self.ray.cancel(ref, force=True)
    self._pending = {}
    if self._runtime_env is not None:
      self.ray.shutdown()
      self._runtime_env, self._corpora = None, {}
