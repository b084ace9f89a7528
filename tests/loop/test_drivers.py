"""The drivers (hybridjax.loop.drivers) through `train`: fused dispatch ('switch', one step or K=4
steps per call) against host dispatch on the MLP problem: the same phase sequence, the same
final state bit for bit, the same metrics and per-step trace, memory records where each dispatch
takes them, checkpoints, and an exact resume from a checkpoint a K=4 run wrote."""

from __future__ import annotations

import math
import os
import shutil

import chex
import hybrid_helper as hh
import pytest
import reliability_helper as rh
from conftest import abstract_driver_state, cached, restore_checkpoint

from hybridjax import checkpoint as ckpt_lib
from hybridjax import writers
from hybridjax.hybrid.phases import PHASE_NAMES, Phase
from hybridjax.loop import train as train_lib

# Three hybrid trainings through `train()` (~75 s): the slow set CI runs. The default suite keeps the
# same equivalence at the step level for one step per call (tests/methods/test_velocity.py::
# test_fused_switch_equals_host_dispatch), on the same programs. Every test here compares
# the dispatches' programs (or reads the runs that do), so the module is `cross_program` as a whole:
# one subprocess with XLA's fusion emitters trains the runs once (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.cross_program]

STEPS, LOG, CKPT = hh.CTX_STEPS, 4, 8
# The module fixture compares host dispatch with fused dispatch at K=4 (the case with the most to get
# wrong); `test_one_step_per_call_is_host_dispatch_too` adds fused dispatch at K=1.
RUNS = {"host": ("host", 1), "switch_k4": ("switch", 4)}
SLOW_RUNS = {"switch": ("switch", 1)}
FUSED = [name for name in RUNS if name != "host"]


def _config(name, jax_cache):
  # The programs of tests/hybrid_helper.py's `setup()`: loaded from the compilation cache when the
  # step-level modules compiled them first.
  c = cached(hh.train_config(*(RUNS | SLOW_RUNS)[name]), jax_cache)
  c.trainer.update(log_every=LOG, checkpoint_every=CKPT)
  return c


def _records(workdir):
  out: dict[str, list[dict]] = {}
  for r in writers.read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    out.setdefault(r["kind"], []).append(r)
  return out


def _restore(workdir, config, step=None):
  _, state, meta = restore_checkpoint(workdir, abstract_driver_state(config, rh.mlp_task()), step)
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"))
  try:
    steps = list(manager.all_steps())
  finally:
    manager.close()
  return state, meta, steps


@pytest.fixture(scope="module")
def runs(tmp_path_factory, jax_cache):
  """The three runs, each to the end: name -> (config, workdir, summary)."""
  root = tmp_path_factory.mktemp("dispatch")
  out = {}
  for name in RUNS:
    c = _config(name, jax_cache)
    out[name] = (c, str(root / name), train_lib.train(c, str(root / name), **rh.mlp_task()))
  return out


def test_same_phase_sequence_and_per_step_trace(runs):
  traces = {name: _records(w)["step"] for name, (_, w, _) in runs.items()}
  host = traces["host"]
  assert [r["step"] for r in host] == list(range(1, STEPS + 1))
  phases = [r["phase"] for r in host]
  assert set(phases) == set(Phase), "".join("WFPC"[p] for p in phases)
  for name in FUSED:
    assert [r["phase"] for r in traces[name]] == phases, name
    # Every field of every step, bit for bit (floats through JSON: exact).
    assert traces[name] == host, name


def test_same_final_state_and_checkpoints(runs):
  states = {}
  for name, (c, w, _) in runs.items():
    state, meta, steps = _restore(w, c)
    assert steps == list(range(CKPT, STEPS + 1, CKPT)), (name, steps)
    assert meta["step"] == STEPS and int(state.train.step) == STEPS and meta["mode"] == "hybrid"
    states[name] = state
  # Bit for bit: params, optimizer, velocity, RSSM, corrector, history, controller and rng.
  for name in FUSED:
    chex.assert_trees_all_equal(states[name], states["host"])


def test_same_train_records_and_summaries(runs):
  recs = {name: _records(w) for name, (_, w, _) in runs.items()}
  host = recs["host"]["train"]
  assert [r["step"] for r in host] == list(range(LOG, STEPS + 1, LOG))
  for name in FUSED:
    train = recs[name]["train"]
    assert [r["step"] for r in train] == [r["step"] for r in host], name
    for a, b in zip(train, host):
      for k in rh.DETERMINISTIC:
        assert a[k] == b[k], (name, a["step"], k)
  # The train record's loss is the last measured loss up to its step.
  for name, rec in recs.items():
    trace = rec["step"]
    for r in rec["train"]:
      last = [s["loss"] for s in trace if s["step"] <= r["step"] and s["measured"]][-1]
      assert r["loss"] == last, (name, r["step"])
  sums = {name: s for name, (_, _, s) in runs.items()}
  for name in FUSED:
    _same_summary(sums[name], sums["host"], name)
  assert (sums["host"]["dispatch"], sums["switch_k4"]["dispatch"], sums["switch_k4"]["steps_per_call"]) == (
    "host",
    "switch",
    4,
  )
  # Per-phase timings exist with host dispatch only.
  assert set(sums["host"]["phase_ms_per_step"]) == set(PHASE_NAMES)
  assert all(v > 0 for v in sums["host"]["phase_ms_per_step"].values())


_SHARED = (
  "phase_steps",
  "backward_passes",
  "validation_forwards",
  "predict_phases",
  "rollbacks",
  "health_events",
  "final_eval_loss",
  "first_train_loss",
  "nonfinite_skipped",
)


def _same_summary(fused, host, name):
  for key in _SHARED:
    assert fused[key] == host[key], (name, key)
  assert "phase_ms_per_step" not in fused, name


def test_unvalidated_predicted_steps_log_a_predicted_loss_and_no_loss(runs):
  for name, (_, w, _) in runs.items():
    trace = _records(w)["step"]
    unmeasured = [r for r in trace if not r["measured"]]
    assert unmeasured, name
    for r in unmeasured:
      assert r["phase"] == Phase.PREDICT and r["loss"] is None, (name, r)
      assert math.isfinite(r["predicted_loss"]) and r["predicted_loss"] > 0, (name, r)
      assert len(r["alpha"]) == len(runs[name][2]["group_names"])
    for r in trace:
      if r["measured"]:
        assert isinstance(r["loss"], float) and math.isfinite(r["loss"]), (name, r)
    with open(os.path.join(w, "metrics.jsonl")) as f:
      assert '"loss": null' in f.read()


def test_memory_records_where_each_dispatch_takes_them(runs):
  recs = {name: _records(w) for name, (_, w, _) in runs.items()}
  trace = recs["host"]["step"]
  # Host dispatch: a reading at every phase transition, before the first step of the new phase
  # (`step` = steps done).
  changes = [
    (a["step"], PHASE_NAMES[a["phase"]], PHASE_NAMES[b["phase"]])
    for a, b in zip(trace, trace[1:])
    if a["phase"] != b["phase"]
  ]
  host = [(r["step"], r["phase_from"], r["phase_to"]) for r in recs["host"]["memory"]]
  assert host == changes and len(changes) >= 4
  # Fused dispatch: a reading at each log whose interval saw the phase change, from the phase at
  # the previous log to the phase now; it shares the log's step.
  for name in FUSED:
    train = recs[name]["train"]
    want, before = [], Phase.WARMUP
    for r in train:
      seen = {s["phase"] for s in recs[name]["step"] if r["step"] - LOG < s["step"] <= r["step"]}
      if seen | {r["phase_now"]} != {before}:
        want.append((r["step"], PHASE_NAMES[before], PHASE_NAMES[r["phase_now"]]))
      before = r["phase_now"]
    got = [(r["step"], r["phase_from"], r["phase_to"]) for r in recs[name]["memory"]]
    assert got == want, name
  for rec in recs.values():
    for r in rec["memory"]:
      assert r["source"] == "jax.live_arrays" and r["bytes_in_use"] == r["live_bytes"] > 0


def test_resume_from_a_k4_checkpoint_continues_identically(runs, tmp_path):
  c, w, _ = runs["switch_k4"]
  resumed = tmp_path / "resumed"
  shutil.copytree(os.path.join(w, "checkpoints", "16"), resumed / "checkpoints" / "16")
  summary = train_lib.train(c, str(resumed), **rh.mlp_task())
  assert summary["start_step"] == 16
  a, _, _ = _restore(str(resumed), c)
  b, _, _ = _restore(w, c)
  chex.assert_trees_all_equal(a, b)
  got, ref = _records(str(resumed)), _records(w)
  assert got["step"] == [r for r in ref["step"] if r["step"] > 16]
  ref_train = {r["step"]: r for r in ref["train"]}
  assert [r["step"] for r in got["train"]] == list(range(20, STEPS + 1, LOG))
  for r in got["train"]:
    for k in rh.DETERMINISTIC:
      assert r[k] == ref_train[r["step"]][k], (r["step"], k)


def test_one_step_per_call_is_host_dispatch_too(runs, tmp_path, jax_cache):
  """Fused dispatch at K=1: host dispatch's trace, records, summary and final state, bit for bit."""
  c, w = _config("switch", jax_cache), str(tmp_path / "switch")
  summary = train_lib.train(c, w, **rh.mlp_task())
  host_c, host_w, host_summary = runs["host"]
  assert _records(w)["step"] == _records(host_w)["step"]
  for a, b in zip(_records(w)["train"], _records(host_w)["train"], strict=True):
    for k in rh.DETERMINISTIC:
      assert a[k] == b[k], (a["step"], k)
  _same_summary(summary, host_summary, "switch")
  assert (summary["dispatch"], summary["steps_per_call"]) == ("switch", 1)
  chex.assert_trees_all_equal(_restore(w, c)[0], _restore(host_w, host_c)[0])
