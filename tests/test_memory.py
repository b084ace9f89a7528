"""Memory behaviour of the hybrid step: donation, flat live memory, bounded overhead, no transfers;
and the readings the loop takes (hybridjax.memory), including a GPU's `memory_stats()` (stubbed).

The step-level tests run on the MLP problem of tests/hybrid_helper.py and share its compiled,
donating step functions (`hh.setup()`).

On CPU, `device.memory_stats()` is None, so "memory" here means the arrays JAX keeps alive
(`jax.live_arrays()`), which is exact, plus the process RSS, which is noisy.
"""

from __future__ import annotations

import gc
import warnings

import hybrid_helper as hh
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reliability_helper as rh
from conftest import cached, small_hybrid_config

from hybridjax import checkpoint as ckpt_lib
from hybridjax import memory as memory_lib
from hybridjax import optim, writers
from hybridjax.hybrid import state as state_lib
from hybridjax.hybrid import step as step_lib
from hybridjax.hybrid.phases import Branch, Phase
from hybridjax.loop import baseline, drivers
from hybridjax.loop import train as train_lib
from hybridjax.methods.velocity import corrector as corrector_lib
from hybridjax.methods.velocity import features as velocity_features
from hybridjax.methods.velocity.plan import init_plan
from hybridjax.models import mlp
from hybridjax.models import rssm as dynamics_lib

DONATION_WARNING = "donated buffers were not usable"
PHASES = tuple(Phase)


def _tree_bytes(tree) -> int:
  return int(sum(np.prod(leaf.shape, dtype=np.int64) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(tree)))


def _live_bytes() -> tuple[int, int]:
  gc.collect()
  return memory_lib.live_array_stats()


def _base_state():
  return optim.init_train_state(jax.tree.map(jnp.asarray, hh.host_params()), hh.TX)


def _assert_donated(old_leaves, what):
  kept = [i for i, leaf in enumerate(old_leaves) if not leaf.is_deleted()]
  assert not kept, f"{what}: {len(kept)} donated input leaves were not consumed: {kept}"


def _no_donation_warnings(caught):
  bad = [str(w.message) for w in caught if DONATION_WARNING in str(w.message)]
  assert not bad, bad


# --- 1. donation ---------------------------------------------------------------------------------


def test_every_phase_step_consumes_its_donated_state():
  s = hh.setup()
  state = s.init_state()
  seen_branches, seen_phases = set(), set()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(200):
      old = jax.tree.leaves(state)
      state, branch, metrics = s.step(state, hh.batch(i))
      jax.block_until_ready(state)
      _assert_donated(old, f"branch {branch} at step {i}")
      del old
      seen_branches.add(branch)
      seen_phases.add(int(metrics["phase"]))
      if len(seen_branches) == len(Branch) and len(seen_phases) == len(PHASES):
        break
  _no_donation_warnings(caught)
  assert seen_branches == set(Branch), seen_branches
  assert seen_phases == set(PHASES), seen_phases


# The scanned step (K steps per call) is a third hybrid program to compile (13 s at the suite's -O0):
# the slow set, which CI runs; the default suite keeps the fused step and the baseline's.
@pytest.mark.parametrize(
  "name", ["fused hybrid_step", pytest.param("hybrid_multi_step", marks=pytest.mark.slow), "baseline train_step"]
)
def test_fused_scanned_and_baseline_steps_consume_their_donated_state(name):
  s = hh.setup()
  stacked = drivers.stack_batches([hh.batch(i) for i in range(4)])
  step_fn, state, batch = {
    "fused hybrid_step": lambda: (s.fused, s.init_state(), hh.batch),
    "hybrid_multi_step": lambda: (s.multi, s.init_state(), lambda i: stacked),
    # the baseline's one step program
    "baseline train_step": lambda: (baseline.make_train_step(hh.loss_fn, hh.TX), _base_state(), hh.batch),
  }[name]()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(3):
      old = jax.tree.leaves(state)
      state, _ = step_fn(state, batch(i), hh.SCHEDULE)
      jax.block_until_ready(state)
      _assert_donated(old, f"{name} at call {i}")
    del state
  _no_donation_warnings(caught)


# --- 2. flat memory ------------------------------------------------------------------------------


def test_live_memory_is_flat_over_1000_hybrid_steps():
  s = hh.setup()
  state = s.init_state(seed=1)
  phases = np.zeros(4, np.int64)
  readings = {}
  for i in range(1, 1001):
    state, _, metrics = s.step(state, hh.batch(i))
    phases[int(metrics["phase"])] += 1
    del metrics
    if i in (20, 200, 1000):
      jax.block_until_ready(state)
      readings[i] = (*_live_bytes(), memory_lib.process_rss_bytes())
  assert all(phases[p] > 0 for p in PHASES), f"phase step counts {phases.tolist()}"
  # Live arrays: exactly the same number and bytes (the state, plus whatever the module holds).
  assert readings[20][:2] == readings[1000][:2], readings
  # RSS is noisy (allocator caches, page reuse); steps 1-200 also include the first executions
  # of every branch. After that, growth over 800 more steps must stay under 2%.
  rss_200, rss_1000 = readings[200][2], readings[1000][2]
  growth = (rss_1000 - rss_200) / rss_200
  print(
    f"live arrays @20 {readings[20][:2]}, @1000 {readings[1000][:2]}; RSS @200 {rss_200} B, "
    f"@1000 {rss_1000} B, growth {growth:.3%}; phase steps {phases.tolist()}"
  )
  assert growth < 0.02, (
    f"RSS grew {growth:.2%} from step 200 ({rss_200} B) to 1000 ({rss_1000} B); phase steps {phases.tolist()}"
  )


# --- 3. bounded overhead -------------------------------------------------------------------------


def _abstract_states(width: int):
  """(hybrid state, baseline state, params) shapes for the MLP with hidden widths (width, width)."""
  model = mlp.MLP(features=(width, width), n_out=1)
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))["params"])
  ctx = drivers.make_context(
    small_hybrid_config(**hh.MAIN), loss_fn=hh.loss_fn, tx=hh.TX, params_shape=params, total_steps=hh.CTX_STEPS
  )
  hybrid = jax.eval_shape(lambda p: step_lib.init_hybrid_state(ctx, p, jax.random.PRNGKey(0)), params)
  base = jax.eval_shape(lambda p: optim.init_train_state(p, hh.TX), params)
  return ctx, hybrid, base, params


def test_hybrid_state_overhead_is_one_params_sized_buffer_plus_small_fixed_buffers():
  ctx, state, base, params = _abstract_states(16)
  params_bytes = _tree_bytes(params)
  g, f, n = ctx.groups.n_groups, velocity_features.feature_dim(ctx.groups), ctx.settings.history_size
  # The small buffers, each from its own definition: the RSSM and corrector (params, Adam state,
  # recurrent state, residual ring), the history ring buffers, the plan, the controller and the rng key.
  dyn = _tree_bytes(jax.eval_shape(lambda: dynamics_lib.init_dynamics(jax.random.PRNGKey(0), ctx.settings.rssm)))
  corr = _tree_bytes(
    jax.eval_shape(
      lambda: corrector_lib.init_corrector(
        jax.random.PRNGKey(0),
        f,
        ctx.settings.corrector_capacity,
        ctx.settings.corrector_hidden,
        ctx.settings.corrector_lr,
      )
    )
  )
  history = 4 * (n * f + n + n * g) + 4 * (2 * f + 1) + 4 + 4  # features, logloss, alpha targets,
  # the normalizer's mean, var and count, pos, count
  ctrl = _tree_bytes(jax.eval_shape(state_lib.init_controller))
  plan = _tree_bytes(
    jax.eval_shape(
      lambda: init_plan(
        max_predict_steps=ctx.control.max_predict_steps,
        n_groups=g,
        feature_dim=f,
        accuracy_window=ctx.settings.accuracy_window,
      )
    )
  )
  rng = 2 * 4
  expected = 1 * params_bytes + dyn + corr + history + plan + ctrl + rng  # velocity: the only params-sized one
  assert _tree_bytes(state.train) == _tree_bytes(base)
  assert _tree_bytes(state) - _tree_bytes(base) == expected, (_tree_bytes(state) - _tree_bytes(base), expected)
  assert _tree_bytes(state.method.history) == history
  # No small buffer grows with the model: 16x the hidden width adds exactly one params-sized
  # buffer's worth (the velocity) to the overhead, nothing else.
  _, big_state, big_base, big_params = _abstract_states(256)
  assert _tree_bytes(big_params) > 100 * params_bytes
  overhead = _tree_bytes(state) - _tree_bytes(base)
  big_overhead = _tree_bytes(big_state) - _tree_bytes(big_base)
  assert big_overhead - overhead == _tree_bytes(big_params) - params_bytes
  # And the live state matches its shape: nothing extra is allocated at init.
  live = hh.setup().init_state()
  assert _tree_bytes(live) == _tree_bytes(state)


def test_peak_live_bytes_bounded_by_baseline_plus_extra_buffers():
  """Peak = max over steps of the live-array bytes sampled right after each step.

  This is a post-step sample, not an allocator peak: CPU does not report
  `peak_bytes_in_use`, and XLA temporaries inside a step are not jax arrays.
  """
  s = hh.setup()
  base_step = baseline.make_train_step(hh.loss_fn, hh.TX)  # the baseline's one step program
  n_steps = 40
  ref = _live_bytes()[1]
  base = _base_state()
  base_peak = 0
  for i in range(n_steps):
    base, m = base_step(base, hh.batch(i), hh.SCHEDULE)
    jax.block_until_ready(base)
    del m
    base_peak = max(base_peak, memory_lib.live_array_stats()[1] - ref)
  del base
  ref = _live_bytes()[1]
  state = s.init_state()
  extra = _tree_bytes(state) - _tree_bytes(state.train)  # the velocity and the small parts
  hyb_peak, phases = 0, set()
  for i in range(n_steps):
    state, _, metrics = s.step(state, hh.batch(i))
    phases.add(int(metrics["phase"]))
    del metrics
    jax.block_until_ready(state)
    hyb_peak = max(hyb_peak, memory_lib.live_array_stats()[1] - ref)
  assert phases == set(PHASES), phases
  print(f"post-step live-bytes peak: baseline {base_peak} B, hybrid {hyb_peak} B, extra buffers {extra} B")
  assert 0 < base_peak and hyb_peak <= base_peak + extra, (hyb_peak, base_peak, extra)


# --- 4. no implicit transfers --------------------------------------------------------------------


def test_fused_step_makes_no_implicit_host_transfers():
  s = hh.setup()
  state = s.init_state()
  n = 40
  batches = [jax.device_put(hh.batch(i)) for i in range(1, n + 1)]
  state, _ = s.fused(state, jax.device_put(hh.batch(0)), hh.SCHEDULE)  # compile outside the guard
  jax.block_until_ready(state)
  collected = []
  with jax.transfer_guard("disallow"):
    for b in batches:
      state, metrics = s.fused(state, b, hh.SCHEDULE)
      collected.append(metrics)
    jax.block_until_ready(state)
  host = jax.device_get(collected)
  # Every step ran under the guard, through every phase (so every branch of the switch).
  assert [int(m["step"]) for m in host] == list(range(2, n + 2))  # steps taken after each
  assert int(state.train.step) == n + 1
  assert {int(m["phase"]) for m in host} == set(PHASES)


# --- 5. readings ---------------------------------------------------------------------------------


class FakeGPU:
  """A device whose `memory_stats()` reads like a GPU's."""

  def __init__(self, id, in_use, peak, limit=16 << 30):
    self.id, self.stats = id, {"bytes_in_use": in_use, "peak_bytes_in_use": peak, "bytes_limit": limit}

  def memory_stats(self):
    return dict(self.stats)


class NoStats:
  id = 0

  def memory_stats(self):
    raise RuntimeError("memory_stats is not supported")


def test_memory_snapshot_reads_device_memory_stats():
  snap = memory_lib.memory_snapshot(FakeGPU(0, 1000, 3000))
  assert snap["source"] == "device.memory_stats"
  assert (snap["bytes_in_use"], snap["peak_bytes_in_use"], snap["bytes_limit"]) == (1000, 3000, 16 << 30)
  assert snap["live_bytes"] >= 0 and snap["rss_bytes"] > 0
  # A backend that raises (or returns None) falls back to the live arrays, and says so.
  snap = memory_lib.memory_snapshot(NoStats())
  assert snap["source"] == "jax.live_arrays" and snap["bytes_in_use"] == snap["live_bytes"]
  assert "peak_bytes_in_use" not in snap


def test_memory_snapshot_on_several_devices_reports_the_fullest(monkeypatch):
  fakes = [FakeGPU(0, 500, 900), FakeGPU(1, 700, 800)]
  monkeypatch.setattr(memory_lib.jax, "local_devices", lambda: fakes)
  snap = memory_lib.memory_snapshot()
  assert snap["source"] == "device.memory_stats (max over 2 devices)" and snap["devices"] == 2
  assert (snap["bytes_in_use"], snap["peak_bytes_in_use"]) == (700, 900)


def test_memory_tracker_uses_the_allocator_peak():
  t = memory_lib.MemoryTracker()
  t.observe({"bytes_in_use": 10, "rss_bytes": 5, "peak_bytes_in_use": 50})
  t.observe({"bytes_in_use": 30, "rss_bytes": 7})
  assert (t.peak_bytes, t.peak_rss) == (50, 7)


@pytest.mark.slow  # a whole train() under faked device stats (7 s); the tracker's own readings stay in the default set
def test_gpu_memory_stats_through_train_warn_and_save_an_emergency_checkpoint(tmp_path, jax_cache, capsys, monkeypatch):
  # The loop reads device.memory_stats() as a GPU reports it (stubbed: CPU has none). The memory in
  # use jumps after the log of step 8; the next log (step 12) crosses trainer.memory_limit_bytes,
  # which warns once and saves an emergency checkpoint, and training goes on to the end.
  level = {"in_use": 1_000_000}
  reads = []

  def stats(device):
    reads.append(device)
    return {"bytes_in_use": level["in_use"], "peak_bytes_in_use": level["in_use"] + 123, "bytes_limit": 16 << 30}

  monkeypatch.setattr(memory_lib, "_device_stats", stats)

  def on_log(step, record):
    if step == 8:
      level["in_use"] = 5_000_000

  c = cached(hh.train_config(), jax_cache)  # 40 steps with the programs of `hh.setup()`
  c.trainer.log_every = 4
  c.trainer.memory_limit_bytes = 4_000_000
  summary = train_lib.train(c, str(tmp_path / "run"), hooks={"on_log": on_log}, **rh.mlp_task())
  out = capsys.readouterr().out
  assert out.count("exceeds trainer.memory_limit_bytes=4000000") == 1, out
  assert "memory in use 5000000 B" in out
  manager = ckpt_lib.make_manager(str(tmp_path / "run" / "checkpoints"))
  assert list(manager.all_steps()) == [12, 40]  # the emergency save, and the final one
  manager.close()
  assert reads and all(d in jax.local_devices() for d in reads)
  records = writers.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
  train = {r["step"]: r["bytes_in_use"] for r in records if r["kind"] == "train"}
  assert train == {s: 1_000_000 if s <= 8 else 5_000_000 for s in range(4, 41, 4)}
  # The phase-transition readings (at log boundaries with the fused step) come from the same source.
  memory = [r for r in records if r["kind"] == "memory"]
  assert memory and all(r["source"] == "device.memory_stats" and r["bytes_limit"] == 16 << 30 for r in memory)
  m = summary["memory"]
  assert m["source"] == "device.memory_stats"
  assert m["peak_bytes"] == 5_000_123 and m["end_bytes"] == 5_000_000 and m["start_bytes"] == 1_000_000
