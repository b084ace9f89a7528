"""Shared fixtures and settings of the test suite.

* `micro_config` (GPT-2 `tiny,micro`, trains in seconds), `STD` and `small_hybrid_config` (a hybrid
  config that cycles through every phase quickly on the test MLP).
* An isolated data cache, and a persistent compilation cache for the session (`jax_cache`).
* XLA at LLVM -O0 (see `XLA_TEST_FLAGS`) and xdist scheduling by module (see the end): compiling,
  not running, dominates the suite.
* The tests marked `slow` are skipped by default (pyproject.toml); `pytest -m ""` runs them too.
* Property tests (hypothesis) draw anew at every run; `HYPOTHESIS_PROFILE=ci` (`.ci/run`) derandomizes them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import hypothesis
import pytest

# The repository's root and the tests' shared data (tests/data/), wherever a test module sits.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_DATA = os.path.join(ROOT, "tests", "data")

# Keep tests off the user's caches and make CPU runs deterministic and quiet. Compiling dominates
# the suite's run time, so the suite compiles at LLVM -O0 (severalfold faster to compile) and with
# XLA:CPU's older fusion emitters (`LEGACY_EMITTERS`: the hybrid step's programs compile about 2.5x
# faster again). The tests check results, never speed. Set XLA_FLAGS to run the suite with other flags;
# tests/loop/test_train.py::test_bit_exact_claims_at_default_xla_optimization (slow) re-runs the
# bit-exact tests at XLA's default level.
#
# The older emitters compile a reduction differently by what it is fused with, so two different
# programs that compute the same thing may round it differently: a hybrid real step, whose
# statistics share the gradient norm's per-leaf sums, and the baseline's step do. A test that
# compares two different programs bit for bit, or a program with a record made at `EMITTER_FLAGS`
# (tests/data/*_numerics.json, by scripts/method_numerics.py), is marked `cross_program` and runs
# in a subprocess with XLA's own fusion emitters (`EMITTER_FLAGS`), which users' programs use.
EMITTER_FLAGS = "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0"
LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
XLA_TEST_FLAGS = f"{EMITTER_FLAGS} {LEGACY_EMITTERS}"
os.environ.setdefault("XLA_FLAGS", XLA_TEST_FLAGS)


# Property tests draw new examples at every run, which is how they find a new counterexample; CI
# (`.ci/run`) runs them derandomized, so that whether a change lands does not depend on the draw.
hypothesis.settings.register_profile("ci", derandomize=True)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
  cache = tmp_path_factory.getbasetemp() / "hybridjax_cache"
  monkeypatch.setenv("HYBRIDJAX_CACHE", str(cache))


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory) -> str:
  """The session's persistent compilation cache, shared by its xdist workers (see `_compile_cache`)."""
  base = tmp_path_factory.getbasetemp()
  root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  path = root / "jax_cache"
  path.mkdir(exist_ok=True)
  return str(path)


@pytest.fixture(scope="session", autouse=True)
def _compile_cache(jax_cache):
  """Every program that takes long to compile goes to the session's persistent cache, so a program
  another test, module or xdist worker compiled already (same model, same config, same jit
  options) is loaded instead of compiled again. JAX takes the cache directory once per process
  (the first one set wins): a run with `trainer.compile_cache` should use `cached(config,
  jax_cache)`, which names this same directory."""
  import jax

  jax.config.update("jax_compilation_cache_dir", jax_cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  yield


def cached(config, jax_cache: str):
  """`config` with the session's persistent compilation cache (see `jax_cache`)."""
  config.trainer.compile_cache = True
  config.trainer.compile_cache_dir = jax_cache
  return config


def load_script(name: str):
  """A script under scripts/ as a module (registered, so its dataclasses resolve)."""
  import importlib.util
  import sys

  mod_name = f"_script_{name}"
  if mod_name not in sys.modules:
    spec = importlib.util.spec_from_file_location(mod_name, os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
  return sys.modules[mod_name]


class SpecRunner:
  """A benchmark runner that trains nothing: each run's result is `result_of(spec)`; it keeps every
  spec it was given (`specs`), for a study's test to read what it asked for."""

  reused = 0

  def __init__(self, result_of):
    self.result_of, self.specs, self.ran = result_of, [], 0

  def run(self, specs, label):
    del label
    self.specs += specs
    self.ran += len(specs)
    return [self.result_of(s) for s in specs]


@contextlib.contextmanager
def method_package(tmp_path, monkeypatch, package: str, source: str):
  """A user's method: `source` written to `<package>.repeat_update`, a package outside hybridjax on
  sys.path; yields its dotted path, and forgets the package's modules after."""
  pkg = tmp_path / package
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "repeat_update.py").write_text(source)
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    yield f"{package}.repeat_update"
  finally:
    for name in [n for n in sys.modules if n.startswith(package)]:
      del sys.modules[name]


def run_experiment(config, workdir, hooks=None) -> dict:
  """Trains a `gpt2_small` experiment config in `workdir` through `loop.train.train`; the summary."""
  from experiments import gpt2_small
  from hybridjax.loop import train as train_lib

  task = gpt2_small.build_task(config)
  return train_lib.train(config, str(workdir), hooks=hooks, **task.train_kwargs())


def restore_checkpoint(workdir, abstract_state, step=None):
  """(step, state, meta) of checkpoint `step` (default: the latest) in `workdir`, restored into
  `abstract_state` (a driver's `abstract_state()`)."""
  from hybridjax import checkpoint as ckpt_lib

  manager = ckpt_lib.make_manager(os.path.join(str(workdir), "checkpoints"))
  try:
    step = manager.latest_step() if step is None else step
    state, meta = ckpt_lib.restore(manager, step, abstract_state)
  finally:
    manager.close()
  return step, state, meta


def abstract_driver_state(config, task) -> object:
  """The abstract state of `config`'s driver for a task's `init_params` and `loss_fn`."""
  from hybridjax.loop import train as train_lib

  return train_lib.make_driver(config, init_params=task["init_params"], loss_fn=task["loss_fn"]).abstract_state()


def restore_latest(workdir, config):
  """(step, state) of the latest checkpoint in `workdir`, restored as `config`'s driver state."""
  from experiments import gpt2_small

  task = gpt2_small.build_task(config)
  step, state, _ = restore_checkpoint(workdir, abstract_driver_state(config, task.train_kwargs()))
  return step, state


def straight_and_resumed(config, tmp_path, stop_after: int):
  """Trains `config` straight through, and again interrupted at the first log at or after
  `stop_after` and resumed from its last checkpoint; checks that the second run resumed from a
  checkpoint (at or after `trainer.checkpoint_every`, before `stop_after`), that both saved their last
  step and that their final states are equal, bit for bit. Returns (straight summary, resumed
  summary, the final state)."""

  class Interrupt(Exception):
    pass

  def on_log(step, record):
    if step >= stop_after:
      raise Interrupt()

  straight = run_experiment(config, tmp_path / "straight")
  with pytest.raises(Interrupt):
    run_experiment(config, tmp_path / "resumed", hooks={"on_log": on_log})
  resumed = run_experiment(config, tmp_path / "resumed")
  import chex

  (step_a, a), (step_b, b) = restore_latest(tmp_path / "straight", config), restore_latest(tmp_path / "resumed", config)
  assert config.trainer.checkpoint_every <= resumed["start_step"] < stop_after
  assert step_a == step_b == config.trainer.steps
  chex.assert_trees_all_equal(a, b)
  return straight, resumed, a


def compile_fused_mlp_step(hybrid, width: int = 16, averaging_beta: float | None = 0.9):
  """The fused `hybrid_step` for `hybrid` (a `config.hybrid` block) on a two-layer MLP of `width`,
  jitted with the state donated and compiled. Returns (compiled program, abstract state)."""
  import jax
  import jax.numpy as jnp

  from hybridjax import config as config_lib
  from hybridjax import optim
  from hybridjax.hybrid import step as step_lib
  from hybridjax.loop import drivers
  from hybridjax.models import mlp

  net = mlp.MLP(features=(width, width), n_out=1)
  x, y = mlp.make_regression_problem(0, n_in=4)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))["params"]
  oc = config_lib.default_optim_config()
  ctx = drivers.make_context(
    hybrid,
    loss_fn=mlp.make_loss_fn(net),
    tx=optim.make_optimizer(oc),
    params_shape=params,
    total_steps=100,
    averaging_beta=averaging_beta,
  )
  state = jax.eval_shape(lambda: step_lib.init_hybrid_state(ctx, params, jax.random.PRNGKey(0)))
  batch = mlp.regression_batch(x, y, step=0, batch_size=32, seed=0)
  compiled = (
    jax.jit(lambda s, b, k: step_lib.hybrid_step(ctx, s, b, k), donate_argnums=0, keep_unused=True)
    .lower(state, batch, optim.make_schedule(oc, 100))
    .compile()
  )
  return compiled, state


def micro_config(mode: str = "baseline", steps: int = 20):
  """The `tiny,micro` preset with test-sized logging: no evals or checkpoints before the end."""
  from experiments.configs import gpt2_small

  c = gpt2_small.get_config("tiny,micro")
  c.mode = mode
  c.trainer.update(
    steps=steps, log_every=5, eval_every=0, eval_batches=2, checkpoint_every=0, progress=False, compile_cache=False
  )
  return c


# Hybrid overrides that cycle through every phase quickly on the test MLP.
STD = {
  "confidence_threshold": 0.0,
  "max_predict_steps": 4,
  "velocity.divergence_tolerance": 0.5,
  "correction_interval": 2,
}


def small_hybrid_config(**overrides):
  """`config.hybrid` with a small RSSM and short warm-up; keys may be dotted ('velocity.rssm.deter')."""
  from hybridjax import config as config_lib

  h = config_lib.default_hybrid_config()
  h.warmup_steps = 10
  h.full_steps = 5
  v = h.velocity
  v.rssm.deter, v.rssm.latent, v.rssm.hidden, v.rssm.ensemble = 32, 8, 32, 2
  v.history_size, v.window = 16, 8
  h.update_from_flattened_dict(overrides)
  return h


# --- xdist scheduling ---------------------------------------------------------------------------
# Compiling dominates this suite, so with `pytest -n N` each test module runs whole on one worker:
# its module-scoped fixtures and compiled step functions are made once, not once per worker.
# Modules that share compiled programs (the MLP hybrid step of tests/hybrid_helper.py) form one
# unit, run in file order: test_corrector compiles the per-phase steps, test_drivers the fused and
# scanned ones, and the later modules find them all in the process's caches. Units start longest
# first (seconds with both workers busy, from `--durations=0`), so the last to finish is a short one;
# a module missing here counts 1 s.
_UNITS = {
  name: "hybrid steps"
  for name in ("test_controller.py", "test_corrector.py", "test_drivers.py", "test_velocity.py", "test_memory.py")
}
_COST = {
  "hybrid steps": 52,
  "test_optim.py": 40,
  "test_reliability.py": 32,
  "test_speedrun_model.py": 37,
  "test_forecast.py": 24,
  "test_rssm.py": 22,
  "test_benchmark.py": 18,
  "test_averaging.py": 18,
  "test_train.py": 16,
  "test_models.py": 15,
  "test_byo.py": 10,
  "test_preflight.py": 9,
  "test_jump.py": 8,
  "test_nonfinite_prediction.py": 7,
  "test_variants.py": 7,
  "test_cluster.py": 7,
  "test_knobs.py": 6,
  "test_ladder.py": 5,
  "test_layering.py": 5,
  "test_plugin_method.py": 5,
  "test_protocol.py": 4,
  "test_keys.py": 4,
  "test_recipe.py": 4,
  "test_selective_backprop.py": 3,
  "test_cli.py": 3,
  "test_data.py": 2,
}


def subprocess_outcomes(
  nodeids: list[str], basetemp, xla_flags: str, timeout: int = 3000
) -> tuple[dict[str, str], str]:
  """Runs `nodeids` in a fresh pytest process (no xdist) with `xla_flags`. Returns each node's
  outcome as pytest's summary names it ('PASSED', 'FAILED', 'ERROR', ...) and the output's tail."""
  import subprocess
  import sys

  # Not an xdist worker: the subprocess keeps its own compilation cache under its own basetemp.
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
  env.update(XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu")
  args = ["-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "", f"--basetemp={basetemp}", *nodeids]
  r = subprocess.run(
    [sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
  )
  outcomes = {}
  _, _, summary = r.stdout.partition("short test summary info")
  for line in summary.splitlines():
    outcome, _, rest = line.partition(" ")
    if outcome in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS") and rest:
      outcomes[rest.split(" - ", 1)[0]] = outcome
  return outcomes, r.stdout[-6000:] + r.stderr[-2000:]


def run_pytest(nodeids: list[str], basetemp, xla_flags: str, timeout: int = 3000) -> None:
  """Runs `nodeids` as `subprocess_outcomes` does; fails with its output unless every test they name
  ran and passed."""
  outcomes, output = subprocess_outcomes(nodeids, basetemp, xla_flags, timeout)
  assert outcomes and set(outcomes.values()) == {"PASSED"}, output


# The outcome of each `cross_program` test run so far in a subprocess, and that subprocess's output.
_CROSS_PROGRAM: dict[str, tuple[str, str]] = {}


def _run_cross_program(item: pytest.Function) -> None:
  """`item`, run in a subprocess with `EMITTER_FLAGS` together with the other selected
  `cross_program` tests of its module (so that its module's fixtures are made once), unless an
  earlier test of the module ran it already; fails unless it passed there."""
  nodeid = item.nodeid
  if nodeid not in _CROSS_PROGRAM:
    module = nodeid.split("::", 1)[0]
    batch = [i.nodeid for i in item.session.items if i.nodeid.split("::", 1)[0] == module and _is_cross_program(i)]
    basetemp = item.config._tmp_path_factory.mktemp("cross_program")
    outcomes, output = subprocess_outcomes(batch, basetemp, EMITTER_FLAGS)
    _CROSS_PROGRAM.update({n: (outcomes.get(n, "NOT RUN"), output) for n in batch})
  outcome, output = _CROSS_PROGRAM[nodeid]
  assert outcome == "PASSED", f"{nodeid}, run with XLA's fusion emitters ({EMITTER_FLAGS}): {outcome}\n{output}"


def _is_cross_program(item: pytest.Item) -> bool:
  return item.get_closest_marker("cross_program") is not None


def pytest_collection_modifyitems(config, items):
  """In a process compiled with the older emitters, a `cross_program` test runs in a subprocess
  instead (see `XLA_TEST_FLAGS` and `_run_cross_program`), and sets up none of its fixtures here:
  the subprocess makes them."""
  if LEGACY_EMITTERS not in os.environ.get("XLA_FLAGS", "").split():
    return
  for item in items:
    if _is_cross_program(item):
      item.setup = lambda: None
      item.runtest = functools.partial(_run_cross_program, item)


def _unit(nodeid: str) -> str:
  module = nodeid.split("::", 1)[0]
  return _UNITS.get(os.path.basename(module), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  from xdist.scheduler import LoadScopeScheduling

  class ModuleScheduling(LoadScopeScheduling):
    """Whole modules (or `_UNITS`) per worker, the costliest first."""

    def _split_scope(self, nodeid):
      return _unit(nodeid)

    def _assign_work_unit(self, node):
      costliest = max(self.workqueue, key=lambda u: _COST.get(os.path.basename(u), _COST.get(u, 1)))
      self.workqueue.move_to_end(costliest, last=False)
      super()._assign_work_unit(node)

  return ModuleScheduling(config, log)
