"""The benchmark's executors (`hybridjax.bench.runs.executors`, `runner`, `cluster`): the settings they
refuse, and the Ray executor on a real two-node Ray cluster on loopback, whose runs must be the local
executor's bits, even when a worker is killed mid-run (slow: CI runs them with the `cluster` extra).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

import ml_collections
import pytest
from conftest import ROOT

from experiments.configs import benchmark as benchmark_cfg
from hybridjax import codehash
from hybridjax.bench import specs
from hybridjax.bench.runs import cluster, keys, runner
from hybridjax.bench.runs import worker as runs

HAVE_RAY = importlib.util.find_spec("ray") is not None  # found, not imported: this process never joins a cluster
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed: pip install -e '.[cluster]' (.ci/run does)")

# What differs between two trainings of the same run: the times and where it trained.
_NOT_BITS = ("compile_s", "train_s", "workdir")


@pytest.mark.parametrize(
  "field, value, named",
  [
    ("executor", "slurm", "benchmark.executor must be one of ['local', 'ray']"),
    ("cpus_per_run", 0, "benchmark.cpus_per_run must be a positive number"),
    ("cpus_per_run", -2, "benchmark.cpus_per_run must be a positive number"),
    ("gpus_per_run", -0.5, "benchmark.gpus_per_run must be 0 (no GPU)"),
    ("gpus_per_run", 1.5, "benchmark.gpus_per_run must be 0 (no GPU)"),
  ],
)
def test_bad_executor_settings_are_refused_naming_the_field(field, value, named):
  named = named.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
  c = benchmark_cfg.get_config("quick")
  with pytest.raises(ValueError, match=named):  # at the assignment, from Python as on the command line
    c.benchmark[field] = value
  c = ml_collections.ConfigDict(c.to_dict())  # a plain copy (a stored record's): checked where it is read
  c.benchmark[field] = value
  with pytest.raises(ValueError, match=named):
    specs.validate_benchmark(c)
  with pytest.raises(ValueError, match=field):
    runner.make_runner(c, "/nonexistent/never-created")


def test_the_ray_executor_without_ray_names_the_extra(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
  c = benchmark_cfg.get_config("quick")
  c.benchmark.executor = "ray"
  with pytest.raises(ImportError, match=r"pip install -e '\.\[cluster\]'"):
    runner.make_runner(c, str(tmp_path))
  assert os.listdir(tmp_path) == []  # refused before anything was created


class _FakeTask:
  def options(self, **kwargs):
    return self

  def remote(self, spec, key, *args):
    return (spec["kind"], key)  # a hashable reference


class _FakeRay:
  """Ray's driver API as the executor uses it, in process: each task's result is its key; `inits`
  counts the connections."""

  class exceptions:  # noqa: N801 (as `ray.exceptions`)
    RayError = RuntimeError

  def __init__(self):
    self.inits = 0

  def init(self, **kwargs):
    self.inits += 1

  def shutdown(self):
    pass

  def put(self, value):
    return value

  def remote(self, fn):
    return _FakeTask()

  def wait(self, refs, num_returns):
    return refs[:num_returns], refs[num_returns:]

  def get(self, ref):
    return {"key": ref[1]}

  def cancel(self, ref, force):
    pass


def test_the_ray_executor_joins_the_cluster_once_for_a_whole_protocol(monkeypatch, tmp_path):
  """The anchors' and the arms' runs of a user's method (its own package, which Ray ships per
  connection) share one connection: the executor ships every package the protocol may run at once."""
  pkg = tmp_path / "users" / "user_arm_pkg"
  pkg.mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "mine.py").write_text(
    "NAME = 'mine'\ndef make_settings(hybrid, *, groups):\n  return ()\ndef init(ctx, params, rng):\n  return None\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path / "users"))
  fake = _FakeRay()
  monkeypatch.setattr(cluster, "_import_ray", lambda: fake)
  c = benchmark_cfg.get_config("quick")
  c.benchmark.arms.mine = {"method": "user_arm_pkg.mine"}
  anchor = specs.run_spec(c, kind="anchor", seed=1, lr=0.01, steps=4, beta=0.9)
  arm = specs.run_spec(c, kind="method", seed=1, lr=0.01, steps=4, beta=0.9, method="mine")
  executor = cluster.RayExecutor("", modules=runner.protocol_modules(c))
  assert [k for k, _ in executor.map([("a", anchor)], str)] == ["a"]
  assert [k for k, _ in executor.map([("m", arm)], str)] == ["m"]
  assert fake.inits == executor.connections == 1
  shipped = {os.path.basename(p) for p in keys.code_packages(runner.protocol_modules(c))}
  assert {"hybridjax", "user_arm_pkg"} <= shipped


@needs_ray
@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "no-port"])
def test_a_ray_address_that_cannot_be_reached_is_refused_at_once(address, tmp_path):
  c = benchmark_cfg.get_config("quick")
  c.benchmark.update(executor="ray", ray_address=address)
  cluster._import_ray()  # importing Ray takes seconds on a loaded machine: not the wait this bounds
  t0 = time.perf_counter()
  with pytest.raises((ConnectionError, ValueError), match=r"benchmark\.ray_address="):
    runner.make_runner(c, str(tmp_path / "bench"))
  assert time.perf_counter() - t0 < cluster.CONNECT_TIMEOUT_S


@needs_ray
def test_an_address_that_answers_but_is_no_ray_cluster_fails_within_bounded_time(tmp_path, monkeypatch):
  """A port that accepts connections and never answers as Ray (where `ray.init` waits without end):
  refused, not a hang."""
  monkeypatch.setattr(cluster, "PROBE_TIMEOUT_S", 5.0)
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    c = benchmark_cfg.get_config("quick")
    c.benchmark.update(executor="ray", ray_address=f"127.0.0.1:{server.getsockname()[1]}")
    cluster._import_ray()  # importing Ray takes seconds on a loaded machine: not the wait this bounds
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"benchmark\.ray_address=.* within 5 s .*nothing was trained"):
      runner.make_runner(c, str(tmp_path / "bench"))
    assert time.perf_counter() - t0 < 15


def test_a_worker_runs_xla_on_one_thread_whatever_the_driver_set():
  assert runs.worker_xla_flags("") == runs.SINGLE_THREAD_FLAG
  flags = runs.worker_xla_flags("--xla_backend_optimization_level=0")
  assert flags.split() == ["--xla_backend_optimization_level=0", runs.SINGLE_THREAD_FLAG]
  assert runs.worker_xla_flags(flags) == flags  # never twice
  env = cluster._task_env(gpus_per_run=0.0)
  assert runs.SINGLE_THREAD_FLAG in env["XLA_FLAGS"].split() and env["JAX_PLATFORMS"] == "cpu"
  assert cluster._task_env(gpus_per_run=0.25)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.237"


def test_the_code_a_worker_needs_is_the_code_the_key_hashes(tmp_path, monkeypatch):
  """The packages shipped to Ray workers hold every file of the runs' source closure, and a user's
  plug-in outside any package is shipped as its file."""
  (tmp_path / "my_task_mod.py").write_text("from hybridjax.tasks.mlp import build_task  # noqa: F401\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  modules = ["hybridjax.bench.runs.anchor_run", "my_task_mod"]
  shipped = keys.code_packages(modules)
  assert str(tmp_path / "my_task_mod.py") in shipped
  package = [p for p in shipped if os.path.basename(p) == "hybridjax"]
  assert len(package) == 1 and os.path.isdir(package[0])
  for path in codehash.source_closure("hybridjax.bench.runs.anchor_run") + codehash.source_closure("my_task_mod"):
    assert any(path == p or path.startswith(p + os.sep) for p in shipped), path
  assert set(codehash.library_versions(modules)) >= {"jax", "jaxlib", "flax", "optax"}


def test_a_shipped_corpus_is_the_same_corpus_on_the_node(tmp_path):
  """A user's corpus (a folder, or one file) packed by the driver and unpacked on a node: the same
  content hash, so the same tokens."""
  from hybridjax import data

  (tmp_path / "corpus" / "sub").mkdir(parents=True)
  (tmp_path / "corpus" / "a.txt").write_text("the first document\n" * 40)
  (tmp_path / "corpus" / "sub" / "b.txt").write_text("a second one, in a subfolder\n" * 40)
  (tmp_path / "one.txt").write_text("a corpus of one file\n" * 40)
  for path in (tmp_path / "corpus", tmp_path / "one.txt"):
    copy = cluster.unpack_corpus(cluster.pack_corpus(str(path)), path.name)
    assert copy != str(path) and os.path.basename(copy) == path.name
    assert data._hash_and_check(*data._list_documents(copy)) == data._hash_and_check(*data._list_documents(str(path)))
  todo = [("k1", {"config": {"data": {"path": str(tmp_path / "one.txt")}}}), ("k2", {"config": {"data": {"path": ""}}})]
  assert cluster.corpus_paths(todo) == [str(tmp_path / "one.txt")]


def test_progress_counts_runs_and_estimates_the_time_left_from_the_steps(monkeypatch):
  todo = [(str(i), {"config": {"trainer": {"steps": n}}}) for i, n in enumerate((300, 100, 100))]
  clock = iter([0.0, 30.0, 40.0, 50.0])
  monkeypatch.setattr(runner.time, "perf_counter", lambda: next(clock))
  progress = runner.Progress(todo)
  result = {"kind": "anchor", "method": "", "seed": 1, "lr": 0.01}
  assert progress.line(result | {"steps": 300}).endswith("(30 s) [1/3, ETA 20 s]")  # 200 steps at 10 steps/s
  assert progress.line(result | {"steps": 100}).endswith("(40 s) [2/3, ETA 10 s]")
  assert progress.line(result | {"steps": 100}).endswith("(50 s) [3/3, ETA 0 s]")


# --- A real Ray cluster: a head and a second node on this machine ---------------------------------
# Each benchmark here runs as the user runs it, `python -m experiments.benchmark`, in a process of its
# own: Ray reads its authentication settings once per process, and the cluster has a token.


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
  """Stops a `ray start --block` and every process it started (its own session)."""
  for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
    try:
      os.killpg(process.pid, sig)
      process.wait(timeout=wait)
      return
    except ProcessLookupError:
      return
    except subprocess.TimeoutExpired:
      continue


def _python(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
  done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  if done.returncode != 0:
    pytest.fail(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
  return done


_NODES = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + 60
while sum(node["Alive"] for node in ray.nodes()) < int(sys.argv[2]):
  assert time.monotonic() < deadline, ray.nodes()
  time.sleep(0.2)
"""


class _Cluster(NamedTuple):
  address: str  # what a driver joins
  env: dict[str, str]  # the environment a driver joins it with (its token)
  sessions: frozenset[int]  # the process sessions of its nodes: its workers' too, not another cluster's


@pytest.fixture(scope="module")
def two_node_cluster():
  """`ray start --head --num-cpus=1` and a second node of one CPU joining it on 127.0.0.1, with a
  token of their own (`_Cluster`). Both nodes are stopped at the end, whatever the tests did."""
  if not HAVE_RAY:
    pytest.skip("Ray is not installed: pip install -e '.[cluster]' (.ci/run does)")
  ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
  port = _free_port()
  address = f"127.0.0.1:{port}"
  env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
  common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
  quiet = {"env": env, "start_new_session": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
  nodes = [
    subprocess.Popen([ray_cli, "start", "--head", f"--port={port}", "--include-dashboard=false", *common], **quiet)
  ]
  try:
    deadline = time.monotonic() + 60
    while True:
      try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
      except OSError:
        if time.monotonic() > deadline or nodes[0].poll() is not None:
          pytest.fail("the Ray head node did not start")
        time.sleep(0.2)
    nodes.append(subprocess.Popen([ray_cli, "start", f"--address={address}", *common], **quiet))
    _python(["-c", _NODES, address, "2"], env, timeout=120)
    # Each `ray start` leads a session of its own (start_new_session), and its node's raylet starts
    # the workers in it.
    yield _Cluster(address, env, frozenset(node.pid for node in nodes))
  finally:
    for node in reversed(nodes):
      _stop(node)
    # Ray records the newest cluster for `ray.init()` to join; this one is gone.
    record = os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")
    if os.path.exists(record):
      with open(record) as f:
        if f.read().strip().endswith(f":{port}"):  # this cluster's head, under the node's address
          os.remove(record)


def _cache_entries(workdir: str) -> dict[str, dict]:
  out = {}
  for path in glob.glob(os.path.join(workdir, "cache", "*.json")):
    with open(path) as f:
      result = json.load(f)
    out[os.path.basename(path)] = {k: v for k, v in result.items() if k not in _NOT_BITS}
  return out


RUN_TITLE = "ray::_run_on_worker"  # Ray titles a worker by the task it runs


def _processes_titled(title: str, sessions: frozenset[int]) -> list[int]:
  """The pids in `sessions` (a cluster's nodes and their workers) whose command line starts with
  `title`. Only that cluster's: another Ray cluster on this machine (another checkout's tests, a
  user's benchmark) may be training runs titled the same."""
  pids = []
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        if not f.read().startswith(title.encode()):
          continue
      with open(f"/proc/{entry}/stat") as f:  # 'pid (comm) state ppid pgrp session ...'
        session = int(f.read().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
      continue
    if session in sessions:
      pids.append(int(entry))
  return pids


class _WorkerKiller(threading.Thread):
  """Kills (SIGKILL) the first worker of the cluster of `sessions` it sees training a run, once."""

  def __init__(self, sessions: frozenset[int]):
    super().__init__(daemon=True)
    self.sessions = sessions
    self.killed: int | None = None
    self.stop = threading.Event()

  def run(self) -> None:
    while not self.stop.is_set() and self.killed is None:
      found = _processes_titled(RUN_TITLE, self.sessions)
      if found:
        time.sleep(1.0)  # well into the run
        try:
          os.kill(int(found[0]), signal.SIGKILL)
          self.killed = int(found[0])
        except ProcessLookupError:
          continue
      time.sleep(0.1)


@pytest.mark.slow
def test_the_quick_protocol_on_two_ray_nodes_computes_the_local_bits_though_a_worker_dies(
  two_node_cluster, tmp_path, jax_cache
):
  """The quick protocol on the local executor and on the two-node cluster, a worker killed during one
  of its runs: the same runs (the same cache keys), each with the same results, bit for bit."""
  address, env, sessions = two_node_cluster
  quick = ["-m", "experiments.benchmark", "--quick", f"--config.trainer.compile_cache_dir={jax_cache}"]
  t0 = time.perf_counter()
  _python([*quick, f"--workdir={tmp_path / 'local'}"], env, timeout=900)
  local_s = time.perf_counter() - t0

  on_ray = [
    f"--workdir={tmp_path / 'ray'}",
    "--config.benchmark.executor=ray",
    f"--config.benchmark.ray_address={address}",
  ]
  killer = _WorkerKiller(sessions)
  killer.start()
  t0 = time.perf_counter()
  try:
    out = _python([*quick, *on_ray], env, timeout=900).stdout
  finally:
    killer.stop.set()
  ray_s = time.perf_counter() - t0
  assert killer.killed is not None, "no Ray worker was seen training a run"
  local, ray_runs = _cache_entries(str(tmp_path / "local")), _cache_entries(str(tmp_path / "ray"))
  assert len(local) > 10 and set(ray_runs) == set(local)
  for key, entry in local.items():
    assert ray_runs[key] == entry, key
  assert re.search(r"\[\d+/\d+, ETA \d+ (s|min)\]", out)  # the progress lines
  print(f"quick protocol: local executor {local_s:.0f} s, two-node Ray cluster {ray_s:.0f} s")


_FAILING_RUN = """
import json, sys
from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import specs
from hybridjax.bench.runs import runner
config = benchmark_cfg.get_config("quick")
config.benchmark.update(executor="ray", ray_address=sys.argv[1])
config.optim.warmup_steps = 2  # the preset's 4 is refused on a 4-step run
spec = specs.run_spec(config, kind="anchor", seed=1, lr=0.01, steps=4, beta=0.9)
spec["config"]["model"]["n_head"] = 3  # d_model 32 is not a multiple of 3: the model cannot be built
with runner.make_runner(config, sys.argv[2]) as r:
  try:
    r.run([spec], "a run that cannot work")
  except RuntimeError as e:
    print("ERROR", e)
"""


@pytest.mark.slow
def test_a_run_that_fails_is_reported_once_naming_its_spec(two_node_cluster, tmp_path):
  address, env, _ = two_node_cluster
  t0 = time.perf_counter()
  out = _python(["-c", _FAILING_RUN, address, str(tmp_path / "bench")], env, timeout=300).stdout
  assert re.search(r"ERROR the run anchor seed 1 lr 0\.01 steps 4 \(key [0-9a-f]+\) failed on the Ray cluster", out)
  assert out.count("ERROR") == 1 and time.perf_counter() - t0 < 120
  assert not glob.glob(str(tmp_path / "bench" / "cache" / "*.json"))  # nothing cached for it


_USER_CORPUS = """
import hashlib, json, os, random, shutil, sys, tempfile
from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import specs
from hybridjax.bench.runs import cluster, runner
address, work, corpus = sys.argv[1:]
os.makedirs(corpus, exist_ok=True)
words = random.Random(0).choices(["the", "run", "a", "node", "token", "corpus", "ships", "once", "bits"], k=60000)
with open(os.path.join(corpus, "text.txt"), "w") as f:
  f.write(" ".join(words))
# Where a node unpacks this corpus (this machine's nodes share its temporary folder): not there yet.
digest = hashlib.sha256(cluster.pack_corpus(corpus)).hexdigest()[:16]
on_node = os.path.join(tempfile.gettempdir(), "hybridjax-ray-corpora", digest)
shutil.rmtree(on_node, ignore_errors=True)
config = benchmark_cfg.get_config("quick")
config.data.path = corpus
config.optim.warmup_steps = 2  # the preset's 4 is refused on a 4-step run
runs = [specs.run_spec(config, kind="anchor", seed=s, lr=0.01, steps=4, beta=0.9) for s in (1, 2)]
out = {}
for executor in ("local", "ray"):
  config.benchmark.update(executor=executor, workers=1, ray_address=address)
  with runner.make_runner(config, os.path.join(work, executor)) as r:
    out[executor] = [{k: v for k, v in x.items() if k not in ("compile_s", "train_s")} for x in r.run(runs, executor)]
  if executor == "local":
    assert not os.path.exists(on_node)
print(json.dumps({"same": out["local"] == out["ray"], "unpacked_on_node": os.path.isdir(on_node)}))
"""


@pytest.mark.slow
def test_a_users_corpus_reaches_the_nodes_and_gives_the_local_bits(two_node_cluster, tmp_path):
  """Runs on a corpus of the user's (`data.path`): on the cluster, each node reads the copy the
  driver shipped (unpacked under the node's temporary folder), with the local executor's results."""
  address, env, _ = two_node_cluster
  out = _python(["-c", _USER_CORPUS, address, str(tmp_path / "work"), str(tmp_path / "my_corpus")], env, 300).stdout
  result = json.loads(out.strip().splitlines()[-1])
  assert result == {"same": True, "unpacked_on_node": True}


@pytest.mark.slow
def test_ctrl_c_cancels_the_runs_on_the_cluster(two_node_cluster, tmp_path, jax_cache):
  """SIGINT to a protocol training on the cluster: it stops, and no worker goes on training a run."""
  address, env, sessions = two_node_cluster
  args = [sys.executable, "-m", "experiments.benchmark", "--quick", f"--workdir={tmp_path / 'bench'}"]
  args += ["--config.benchmark.executor=ray", f"--config.benchmark.ray_address={address}"]
  args.append(f"--config.trainer.compile_cache_dir={jax_cache}")
  # The driver gets SIGINT's default disposition, as from a shell, whatever this test process inherited.
  driver = subprocess.Popen(
    args,
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
  )
  t0 = time.monotonic()

  def fail(what: str, output: str | None = None) -> None:
    """Fails naming `what`, when, and what the driver printed (stopped first if it still runs)."""
    if output is None:
      if driver.poll() is None:
        driver.kill()
      output = driver.communicate()[0]
    pytest.fail(f"{what} ({time.monotonic() - t0:.0f} s after the driver started); its output:\n{output[-3000:]}")

  try:
    while not _processes_titled(RUN_TITLE, sessions):  # a run is training on one of this cluster's nodes
      if driver.poll() is not None or time.monotonic() - t0 > 180:
        fail(f"no run started on the cluster (driver exit status {driver.poll()})")
      time.sleep(0.2)
    driver.send_signal(signal.SIGINT)
    try:
      output, _ = driver.communicate(timeout=60)
    except subprocess.TimeoutExpired:
      fail("the driver did not stop within 60 s of SIGINT")
    if driver.returncode == 0:  # interrupted, not finished
      fail("the driver finished after SIGINT", output)
    deadline = time.monotonic() + 30
    while left := _processes_titled(RUN_TITLE, sessions):
      if time.monotonic() > deadline:
        fail(f"workers {left} went on training 30 s after the driver stopped", output)
      time.sleep(0.5)
  finally:
    if driver.poll() is None:
      driver.kill()
