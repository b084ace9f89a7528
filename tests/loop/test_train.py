"""The host loop (hybridjax.loop.train): learning, exact resume, refusals, the baseline equivalence of
hybrid training through `train`, and the loop's small helpers."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import chex
import ml_collections
import numpy as np
import pytest
import reliability_helper as rh
from conftest import cached, micro_config, restore_latest, run_pytest
from conftest import run_experiment as _run

from hybridjax import writers
from hybridjax.hybrid.phases import Phase
from hybridjax.loop import drivers
from hybridjax.loop import train as train_lib


def _records(workdir, kind="train"):
  return [r for r in writers.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["kind"] == kind]


def test_tiny_run_learns(tmp_path, jax_cache):
  c = cached(micro_config(steps=40), jax_cache)
  c.trainer.eval_every = 20
  summary = _run(c, tmp_path / "run")
  assert summary["final_eval_loss"] < 0.8 * np.log(256)
  assert summary["first_train_loss"] > summary["final_eval_loss"]
  assert [r["step"] for r in _records(tmp_path / "run", "eval")] == [20, 40]
  assert [r["step"] for r in _records(tmp_path / "run")] == list(range(5, 41, 5))
  assert os.listdir(tmp_path / "run" / "tb")
  assert summary["train_s"] > 0 and summary["compile_s"] > 0 and summary["nonfinite_skipped"] == 0


def test_resume_is_bit_exact(tmp_path, jax_cache):
  c = cached(micro_config(steps=20), jax_cache)
  c.trainer.checkpoint_every = 10
  _run(c, tmp_path / "straight")

  class Interrupt(Exception):
    pass

  def on_log(step, record):
    if step == 15:  # after the checkpoint at step 10 has been written
      raise Interrupt()

  with pytest.raises(Interrupt):
    _run(c, tmp_path / "resumed", hooks={"on_log": on_log})
  summary = _run(c, tmp_path / "resumed")
  assert summary["start_step"] == 10
  step_a, a = restore_latest(tmp_path / "straight", c)
  step_b, b = restore_latest(tmp_path / "resumed", c)
  assert step_a == step_b == 20
  chex.assert_trees_all_equal(a, b)
  # The resumed log replays step 15 (written before the interrupt) once, with the same loss.
  straight = {r["step"]: r["loss"] for r in _records(tmp_path / "straight")}
  resumed = {r["step"]: r["loss"] for r in _records(tmp_path / "resumed")}
  assert resumed == straight
  steps = [(r["step"], r["kind"]) for r in writers.read_jsonl(os.path.join(tmp_path / "resumed", "metrics.jsonl"))]
  assert len(steps) == len(set(steps)), f"a step logged twice after the resume: {steps}"
  # A finished run is not trained again, and its summary is kept.
  again = _run(c, tmp_path / "resumed")
  assert again["start_step"] == 10 and again == summary


@pytest.mark.slow  # trains twice; the default suite checks the exit codes (tests/test_cli.py)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_the_step_and_the_resume_is_bit_exact(signum, tmp_path, jax_cache):
  """SIGTERM or Ctrl-C mid-run: the state at the end of the step under way is saved, the run stops
  with `TrainingInterrupted` (exit code 143 or 130), and resuming it ends bit for bit where the
  uninterrupted run ends, with no step logged twice."""
  c = cached(micro_config(steps=20), jax_cache)
  c.trainer.checkpoint_every = 0  # no periodic checkpoint: only the interrupt saves
  _run(c, tmp_path / "straight")
  handler = signal.getsignal(signal.SIGINT)

  def on_log(step, record):
    if step == 10:
      os.kill(os.getpid(), signum)

  with pytest.raises(train_lib.TrainingInterrupted) as caught:
    _run(c, tmp_path / "resumed", hooks={"on_log": on_log})
  assert caught.value.exit_code == 128 + signum and caught.value.saved and caught.value.step == 10
  assert signal.getsignal(signal.SIGINT) is handler  # the handlers are back
  summary = _run(c, tmp_path / "resumed")
  assert summary["start_step"] == 10
  (_, a), (_, b) = restore_latest(tmp_path / "straight", c), restore_latest(tmp_path / "resumed", c)
  chex.assert_trees_all_equal(a, b)
  steps = [(r["step"], r["kind"]) for r in writers.read_jsonl(os.path.join(tmp_path / "resumed", "metrics.jsonl"))]
  assert len(steps) == len(set(steps)), f"a step logged twice after the resume: {steps}"


def test_resume_refuses_other_config(tmp_path, jax_cache):
  c = cached(micro_config(steps=10), jax_cache)
  _run(c, tmp_path / "run")
  c2 = cached(micro_config(steps=10), jax_cache)
  c2.optim.learning_rate = 1e-4
  with pytest.raises(ValueError, match="optim.learning_rate"):
    _run(c2, tmp_path / "run")
  c3 = cached(micro_config(steps=10), jax_cache)
  c3.model.d_model = 64
  c3.resume = "force"
  with pytest.raises(ValueError, match="does not match"):
    _run(c3, tmp_path / "run")
  c4 = cached(micro_config(steps=10), jax_cache)
  c4.resume = "never"
  with pytest.raises(ValueError, match="resume=auto"):
    _run(c4, tmp_path / "run")
  assert os.listdir(tmp_path / "run" / "checkpoints")  # nothing deleted


# Both dispatches run with the slow tests (CI): the default suite's budget; the transitions' own
# equality with the baseline step is checked in tests/methods/test_velocity.py.
@pytest.mark.cross_program
@pytest.mark.parametrize(
  "dispatch", [pytest.param("switch", marks=pytest.mark.slow), pytest.param("host", marks=pytest.mark.slow)]
)
def test_hybrid_without_prediction_equals_baseline_through_train(tmp_path, jax_cache, dispatch):
  # GPT-2 micro, the state donated to every step (as `train` always does), two micro-batches per
  # step: hybrid training with prediction off computes the baseline's params bit for bit, and logs
  # its losses.
  runs = {}
  for mode in ("baseline", "hybrid"):
    c = cached(micro_config(mode, steps=20), jax_cache)
    c.trainer.grad_accum = 2
    c.trainer.checkpoint_every = 10
    c.hybrid.enable_predict = False
    c.hybrid.dispatch = dispatch
    _run(c, tmp_path / mode)
    runs[mode] = (c, _records(tmp_path / mode))
  (cb, base), (ch, hyb) = runs["baseline"], runs["hybrid"]
  assert [r["step"] for r in base] == [r["step"] for r in hyb] == [5, 10, 15, 20]
  assert [r["loss"] for r in base] == [r["loss"] for r in hyb]
  assert {r["phase_now"] for r in hyb} <= {0, 1}  # WARMUP and FULL only
  trace = _records(tmp_path / "hybrid", "step")
  assert len(trace) == 20 and all(r["measured"] for r in trace)
  assert [r["loss"] for r in trace if r["step"] % 5 == 0] == [r["loss"] for r in base]
  step_b, b = restore_latest(tmp_path / "baseline", cb)
  step_h, h = restore_latest(tmp_path / "hybrid", ch)
  assert step_b == step_h == 20
  chex.assert_trees_all_equal(h.train.params, b.params)
  chex.assert_trees_all_equal(h.train.opt_state, b.opt_state)
  assert int(h.train.step) == int(b.step) == 20


@pytest.mark.slow  # every bit-exact test again, at XLA's default level: several minutes
def test_bit_exact_claims_at_default_xla_optimization(tmp_path):
  # The suite compiles at LLVM -O0 with the older fusion emitters (tests/conftest.py: compiling
  # dominates its run time). The bit-exact claims must hold for the programs users run: the same
  # tests at XLA's default level and emitters.
  tests = [
    "tests/loop/test_train.py::test_hybrid_without_prediction_equals_baseline_through_train",
    "tests/methods/test_velocity.py::test_real_steps_equal_baseline_steps_bit_exactly",
    "tests/methods/test_velocity.py::test_fused_switch_equals_host_dispatch",
    "tests/methods/test_velocity.py::test_fused_scan_equals_host_dispatch",
    "tests/methods/test_outer_momentum.py::test_identity_setting_is_the_baseline_exactly_and_a_real_setting_is_not",
    "tests/loop/test_drivers.py",
  ]
  run_pytest(tests, tmp_path / "tmp", "--xla_cpu_multi_thread_eigen=false")


@pytest.mark.cross_program
@pytest.mark.slow  # three 120-step runs of GPT-2 micro, two of them hybrid
def test_micro_gpt2_hybrid_close_to_baseline_with_flat_memory_at_phase_changes(tmp_path, jax_cache):
  # Hybrid training on GPT-2 micro ends within 5% of the baseline's eval loss while predicting,
  # and the live arrays are the same at every memory reading of its second half: with host
  # dispatch a reading at every phase transition, with the fused step one at each log whose
  # interval saw one. Both dispatches compute the same run.
  summaries = {}
  for name, mode, dispatch in (
    ("baseline", "baseline", "switch"),
    ("host", "hybrid", "host"),
    ("switch", "hybrid", "switch"),
  ):
    c = cached(micro_config(mode=mode, steps=120), jax_cache)
    c.hybrid.confidence_threshold = 0.2
    c.hybrid.dispatch = dispatch
    summaries[name] = _run(c, tmp_path / name)
  base = summaries["baseline"]["final_eval_loss"]
  for name in ("host", "switch"):
    s = summaries[name]
    assert s["predict_fraction"] > 0 and s["final_eval_loss"] <= 1.05 * base, (name, s, base)
    events = _records(tmp_path / name, "memory")
    assert {e["phase_to"] for e in events} >= {"FULL", "PREDICT", "CORRECT"}, name
    # (The first readings can still include garbage from start-up not yet collected: compare the
    # second half of the run.)
    later = [e for e in events if e["step"] > 60]
    assert len(later) >= 5, (name, later)
    assert len({(e["live_arrays"], e["live_bytes"]) for e in later}) == 1, (name, later)
  host, switch = (_records(tmp_path / n, "memory") for n in ("host", "switch"))
  trace = _records(tmp_path / "host", "step")
  assert len(host) == sum(a["phase"] != b["phase"] for a, b in zip(trace, trace[1:]))
  assert all(e["step"] % 5 == 0 for e in switch) and len(switch) < len(host)
  assert _records(tmp_path / "switch", "step") == trace
  assert summaries["switch"]["final_eval_loss"] == summaries["host"]["final_eval_loss"]


# --- the loop's helpers -----------------------------------------------------------------------------


def test_stopwatch_counts_only_running_spans():
  w = train_lib.Stopwatch()
  w.pause()  # not running: nothing to stop
  assert w.total == 0.0
  w.resume()
  time.sleep(0.02)
  w.resume()  # already running: the span keeps its start
  time.sleep(0.02)
  w.pause()
  first = w.total
  assert first >= 0.04
  time.sleep(0.05)  # paused: not counted
  w.pause()
  assert w.total == first
  w.resume()
  time.sleep(0.01)
  w.pause()
  assert first + 0.01 <= w.total < first + 0.05


def test_dispatches_never_cross_a_log_eval_or_checkpoint():
  assert train_lib._next_boundary(0, 100, (10, 0, 25)) == 10
  assert train_lib._next_boundary(10, 100, (10, 0, 25)) == 20
  assert train_lib._next_boundary(20, 100, (10, 0, 25)) == 25
  assert train_lib._next_boundary(95, 100, (0, 0, 0)) == 100
  assert train_lib._is_time(29, 30, 10, 100) and train_lib._is_time(99, 100, 0, 100)
  assert not train_lib._is_time(30, 31, 10, 100) and not train_lib._is_time(29, 30, 0, 100)
  # A jump that crosses an interval without landing on it fires it; one inside an interval does not.
  assert train_lib._is_time(27, 43, 10, 100) and not train_lib._is_time(31, 38, 10, 100)


def test_format_summary_lists_the_run():
  summary = {
    "mode": "hybrid",
    "steps": 20,
    "start_step": 0,
    "first_train_loss": 5.5,
    "final_eval_loss": 2.25,
    "compile_s": 1.0,
    "train_s": 2.0,
    "s_per_step": 0.1,
    "phase_steps": {"WARMUP": 10, "FULL": 10, "PREDICT": 0, "CORRECT": 0},
    "dispatch": "switch",
    "memory": {},
  }
  text = train_lib.format_summary(summary)
  assert text.startswith("run summary")
  assert re.search(r"final eval loss +2.25\n", text) and re.search(r"steps +0 -> 20\n", text)
  assert re.search(r"dispatch +switch", text)
  assert "phase steps" in text and "memory" not in text


def test_make_driver_rejects_unknown_modes():
  c = micro_config()
  with c.unlocked():
    c.mode = "turbo"
  with pytest.raises(ValueError, match="config.mode"):
    train_lib.make_driver(c, init_params=lambda rng: {}, loss_fn=lambda p, b: (0.0, {}))


def test_stack_batches_adds_a_leading_axis():
  batches = [{"x": np.full((2, 3), i, np.float32), "y": np.int32(i)} for i in range(4)]
  stacked = drivers.stack_batches(batches)
  assert stacked["x"].shape == (4, 2, 3) and stacked["y"].shape == (4,)
  np.testing.assert_array_equal(stacked["y"], np.arange(4))


# --- a workdir of an older version, and a mistake caught before anything is written ---------------

LEGACY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "legacy_workdirs")


def _legacy_task():
  from hybridjax.models import mlp

  model = mlp.MLP(features=(16,), n_out=1)
  x, y = mlp.make_regression_problem(0, n_in=4, n=256)
  return dict(
    init_params=lambda rng: model.init(rng, x[:1])["params"],
    loss_fn=mlp.make_loss_fn(model),
    train_batch=lambda step: mlp.regression_batch(x[:192], y[:192], step, 16, seed=0),
    eval_batches=[{"x": x[192:], "y": y[192:]}],
  )


def _legacy_config(mode, steps):
  """The config that wrote `tests/data/legacy_workdirs/<mode>` (20 steps, a checkpoint at 10 and 20),
  at the version before `hybrid.method` defaulted to '' (its saved config says 'velocity')."""
  from hybridjax import config as config_lib

  c = config_lib.default_config(mode)
  c.trainer.update(steps=steps, progress=False, log_every=10, eval_every=0, checkpoint_every=10, max_to_keep=1)
  c.trainer.update(compile_cache=False, eval_batches=1)  # the held-out count may change on a resume
  c.optim.update(learning_rate=1e-2, warmup_steps=5)
  if mode == "hybrid":  # the baseline reads no hybrid field (its saved config holds these; a resume ignores them)
    c.hybrid.update(warmup_steps=10, full_steps=5)
    c.hybrid.velocity.update(history_size=16, window=8)
    c.hybrid.velocity.rssm.update(deter=16, latent=4, hidden=16, ensemble=2)
  return c


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["baseline", "hybrid"])
def test_a_workdir_written_by_the_earlier_version_resumes(mode, tmp_path, capsys):
  import shutil

  workdir = tmp_path / mode
  from hybridjax import checkpoint as ckpt_lib

  shutil.copytree(os.path.join(LEGACY, mode), workdir)
  c = _legacy_config(mode, steps=30)
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"))
  try:  # the config it was written with compares equal to today's spelling of it
    assert ckpt_lib.config_differences(ckpt_lib.read_meta(manager, 20)["config"], c) == []
  finally:
    manager.close()
  # It finished its 20 steps; continuing it to 30 rebuilds the schedule, which only resume='force' may.
  with pytest.raises(ValueError, match=r"--config\.trainer\.steps=20 to resume it"):
    train_lib.train(c, str(workdir), **_legacy_task())
  c.resume = "force"
  summary = train_lib.train(c, str(workdir), **_legacy_task())
  assert summary["start_step"] == 20 and summary["steps"] == 30 and summary["mode"] == mode
  assert summary["steps_changes"] == [{"step": 20, "from": 20, "to": 30}]
  assert np.isfinite(summary["final_eval_loss"])
  # It evaluated on 8 held-out batches, this resume on 1: said, and each eval record carries its count.
  out = capsys.readouterr().out
  assert "--config.trainer.eval_batches=1, where the run before step 20 evaluated on 8" in out
  # It records no code fingerprint: said, and this run's is recorded from here on.
  assert f"note: the checkpoint at step 20 in {workdir} records no code fingerprint" in out
  assert "code_changes" not in summary and sorted(summary["code"]) == ["hybridjax", "own"]
  with open(workdir / "metrics.jsonl") as f:
    evals = [r for r in map(json.loads, f) if r["kind"] == "eval" and r["step"] > 20]
  assert evals and all(r["eval_batches"] == 1 for r in evals)


def test_a_misspelt_key_stops_train_before_the_workdir_is_made(tmp_path):
  c = _legacy_config("hybrid", steps=30)
  with pytest.raises(AttributeError, match=r'Did you mean "warmup_steps" instead of "warmup_step"\?'):
    c.hybrid.warmup_step = 5  # the preset is locked: the misspelling fails where it is set
  c = ml_collections.ConfigDict(c.to_dict())  # a config of the user's own, unlocked: train() names it
  c.hybrid.warmup_step = 5
  message = r"--config\.hybrid\.warmup_step is not a field.*--config\.hybrid\.warmup_steps\?"
  with pytest.raises(ValueError, match=message):
    train_lib.train(c, str(tmp_path / "run"), **_legacy_task())
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("batch_size", 32, r"train_batch\(0\) gives batches of 16 examples.*config\.trainer\.batch_size = 16"),
    ("eval_batches", 8, r"holds 1 held-out batches.*config\.trainer\.eval_batches = 1"),
  ],
)
def test_batches_other_than_the_config_states_stop_train_before_the_workdir_is_made(tmp_path, field, value, message):
  # train() takes the user's batches as given; a config that states others would record a batch size
  # or a held-out count the run never used.
  c = _legacy_config("baseline", steps=30)
  c.trainer[field] = value
  with pytest.raises(ValueError, match=message):
    train_lib.train(c, str(tmp_path / "run"), **_legacy_task())
  assert not os.path.exists(tmp_path / "run")


def test_a_batch_leaf_without_a_batch_axis_under_grad_accum_stops_train_before_the_workdir(tmp_path):
  """Gradient accumulation cuts every leaf's first axis into micro-batches: a shared leaf (class
  weights of shape (4,)) would be cut too, each micro-batch weighting by a piece of it."""
  c = _legacy_config("baseline", steps=30)
  c.trainer.grad_accum = 2
  task = _legacy_task()
  plain = task["train_batch"]
  task["train_batch"] = lambda step: {**plain(step), "weights": np.ones(4, np.float32)}
  message = r"grad_accum=2 splits every leaf.*\['weights'\] \(4,\) have no batch axis of 16"
  with pytest.raises(ValueError, match=message):
    train_lib.train(c, str(tmp_path / "run"), **task)
  assert not os.path.exists(tmp_path / "run")
  c.trainer.grad_accum = 1  # one batch: nothing is cut; the check above is grad_accum's alone
  train_lib.check_batch_counts(c.trainer, task["train_batch"](0), task["eval_batches"])


@pytest.mark.parametrize(("method", "fields"), [("velocity", ["phase", "pred", "conf"]), ("selective_backprop", [])])
def test_the_progress_bar_shows_phases_only_for_a_method_that_predicts(method, fields):
  task = rh.mlp_task()
  c = rh.mlp_config("hybrid", method=method)
  driver = train_lib.make_driver(c, init_params=task["init_params"], loss_fn=task["loss_fn"])
  record = {"phase_now": int(Phase.FULL), "predict_fraction": 0.0, "confidence_now": 0.0}
  assert list(driver.progress_fields(record)) == fields
