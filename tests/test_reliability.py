"""Reliability: exact resume in every phase, crash during a save, foreign or corrupt checkpoints,
numerical faults, bad input, and a short soak.

Every hybrid run here is the MLP of `reliability_helper` under one config (`_config`), so all of
them, and the soak, run the same three compiled step programs: they are compiled once and then
loaded from a persistent compilation cache shared by the module (compiling the RSSM dominates).
Shorter runs are prefixes of that 500-step run, stopped by an `on_log` hook.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import chex
import hypothesis
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import reliability_helper as rh
from conftest import cached, micro_config, restore_checkpoint
from hypothesis import strategies as st

from experiments import gpt2_small as experiment
from hybridjax import checkpoint as ckpt_lib
from hybridjax import config as config_lib
from hybridjax import data as data_lib
from hybridjax import optim, preflight, writers
from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid.phases import Branch, Phase
from hybridjax.loop import drivers
from hybridjax.loop import train as train_lib

WARMUP, FULL, PREDICT, CORRECT = Phase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import soak  # noqa: E402

STEPS = 500
# WARMUP longer than the health monitor's own warm-up, so a spike inside WARMUP is detectable; a
# short cooldown, so the fault test cycles through the phases quickly.
HYBRID = {"warmup_steps": controller_lib.HEALTH_WARMUP + 6, "health.cooldown_steps": 8}
PHASES = {"WARMUP": WARMUP, "FULL": FULL, "PREDICT": PREDICT, "CORRECT": CORRECT}


def _config(jax_cache: str, mode: str = "hybrid") -> ml_collections.ConfigDict:
  """The module's config; `jax_cache` is the session's persistent compilation cache (conftest)."""
  return cached(rh.mlp_config(mode, steps=STEPS, **HYBRID), jax_cache)


class Stop(Exception):
  """Raised by an `on_log` hook to end a run early (as a crash would)."""


def _stop_at(step: int):
  def on_log(done, record):
    if done >= step:
      raise Stop()

  return on_log


def _records(workdir, kind="train") -> dict[int, dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  return {r["step"]: r for r in writers.read_jsonl(path) if r["kind"] == kind}


def _abstract_state(config, task):
  return train_lib.make_driver(config, init_params=task["init_params"], loss_fn=task["loss_fn"]).abstract_state()


def _restore(workdir, step, abstract):
  return restore_checkpoint(workdir, abstract, step)[1:]


def _finite(tree) -> bool:
  return all(
    np.all(np.isfinite(x))
    for x in jax.tree.leaves(jax.device_get(tree))
    if np.issubdtype(np.asarray(x).dtype, np.inexact)
  )


def _snapshot(root) -> dict[str, str]:
  """Every path under `root` with the sha256 of each file: what 'nothing changed' is checked by."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    rel = os.path.relpath(dirpath, root)
    for d in dirnames:
      out[os.path.join(rel, d) + "/"] = "dir"
    for f in filenames:
      with open(os.path.join(dirpath, f), "rb") as fh:
        out[os.path.join(rel, f)] = hashlib.sha256(fh.read()).hexdigest()
  return out


# --- 1. exact resume in every phase ---------------------------------------------------------------


def _pick_checkpoints(phase_now: dict[int, int], last: int) -> dict[str, int]:
  """One checkpoint step per phase, each inside its phase (not at its first step where possible):
  WARMUP and FULL mid-phase, PREDICT after a predicted step, CORRECT at its entry (the rollback of
  the predicted segment still pending)."""
  picks = {}
  for s in range(2, last):
    p, prev = phase_now[s], phase_now[s - 1]
    if p in (WARMUP, FULL) and prev == p and s >= 3 and PHASES_BY_ID[p] not in picks:
      picks[PHASES_BY_ID[p]] = s
    if p == PREDICT and prev == PREDICT and "PREDICT" not in picks:
      picks["PREDICT"] = s
    if p == CORRECT and prev == PREDICT and "CORRECT" not in picks:
      picks["CORRECT"] = s
  return picks


PHASES_BY_ID = {v: k for k, v in PHASES.items()}


@pytest.mark.slow  # CI runs it (`-m ""`); kept out of the default suite's 300 s
def test_resume_from_a_checkpoint_in_every_phase_is_bit_exact(tmp_path, jax_cache, monkeypatch):
  # An uninterrupted run that keeps a checkpoint in each phase; a run that died right after the
  # checkpoint of step s leaves exactly that checkpoint directory behind. Resumed from it, the run
  # must reproduce the uninterrupted one bit for bit: every logged metric, the phase sequence, and
  # the whole HybridState (params, optimizer, velocity, RSSM, corrector, history, controller, rng).
  config = _config(jax_cache)
  config.trainer.checkpoint_every = 1
  end = HYBRID["warmup_steps"] + 18
  straight = tmp_path / "straight"
  # Of the checkpoint after every step, write only those picked (the log of a step comes before
  # its checkpoint) and the last: each save costs more than a step here.
  seen: dict[int, int] = {}
  save = ckpt_lib.save

  def on_log(step, record):
    seen[step] = int(record["phase_now"])
    if step > end:
      raise Stop()

  def save_picked(manager, step, state, meta):
    if step == end or step in _pick_checkpoints(seen, step + 1).values():
      save(manager, step, state, meta)

  monkeypatch.setattr(ckpt_lib, "save", save_picked)
  with pytest.raises(Stop):
    train_lib.train(config, str(straight), hooks={"on_log": on_log}, **rh.mlp_task())
  monkeypatch.setattr(ckpt_lib, "save", save)
  ref = _records(straight)
  phase_now = {s: int(r["phase_now"]) for s, r in ref.items()}
  picks = _pick_checkpoints(phase_now, end - 2)
  sequence = "".join("WFPC"[phase_now[s]] for s in sorted(phase_now))
  assert set(picks) == set(PHASES), (picks, sequence)
  task = rh.mlp_task()
  abstract = _abstract_state(config, task)
  want, _ = _restore(straight, end, abstract)
  config_json = json.loads(config.to_json())

  for name, s in picks.items():
    # The data position and the config are stored beside the state, and agree with it.
    state_s, meta = _restore(straight, s, abstract)
    assert meta["step"] == s and int(state_s.train.step) == s
    assert meta["config"] == config_json and meta["mode"] == "hybrid"
    assert int(state_s.controller.phase) == PHASES[name]
    if name == "CORRECT":
      assert int(state_s.controller.next_branch) == Branch.CORRECT_STEP
    resumed = tmp_path / f"resumed_{name}"
    shutil.copytree(straight / "checkpoints" / str(s), resumed / "checkpoints" / str(s))
    config.trainer.checkpoint_every = end  # only the checkpoint compared below
    with pytest.raises(Stop):
      train_lib.train(config, str(resumed), hooks={"on_log": _stop_at(end + 1)}, **task)
    got = _records(resumed)
    assert sorted(got) == list(range(s + 1, end + 2)), f"{name}: resumed at the wrong step"
    for step, record in got.items():
      for k in rh.DETERMINISTIC:
        assert record[k] == ref[step][k], f"resumed in {name} at {s}: {k} differs at step {step}"
    # The per-step trace too (measured, loss or null, predicted loss, alpha, ...).
    trace, ref_trace = _records(resumed, "step"), _records(straight, "step")
    assert trace == {k: v for k, v in ref_trace.items() if s < k <= end + 1}, name
    state, _ = _restore(resumed, end, abstract)
    chex.assert_trees_all_equal(state, want)


# --- 2. crash during a save -----------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_during_async_save_keeps_the_previous_checkpoint(tmp_path, jax_cache):
  workdir = tmp_path / "run"
  steps = 30
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # The child imports the helper as the parent does (not as __main__), so that the run's code fingerprint
  # (loop.fingerprint: a module's functions by its file's code, __main__'s by their bytecode) is the same.
  child = (
    "import sys; sys.path.insert(0, 'tests'); import jax; jax.config.update('jax_platforms', 'cpu'); "
    "import reliability_helper; reliability_helper.main(sys.argv)"
  )
  proc = subprocess.Popen(
    [sys.executable, "-c", child, str(workdir), str(steps), "10"],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  lines = []
  try:
    for line in proc.stdout:  # the save of step 10 is stalled just before its commit
      lines.append(line)
      if line.startswith("SAVE_STALLED 10"):
        proc.send_signal(signal.SIGKILL)
        break
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, "".join(lines[-30:])
  assert "SAVE_STARTED 5\n" in lines and "SAVE_STARTED 10\n" in lines
  ckpt_dir = workdir / "checkpoints"
  names = sorted(os.listdir(ckpt_dir))
  # The half-written checkpoint is there, under orbax's temporary name...
  partial = [n for n in names if n.startswith("10.") and "tmp" in n]
  assert "5" in names and "10" not in names and partial, names
  assert os.listdir(ckpt_dir / partial[0])  # (its data had been written)
  # ...and it is not taken for a checkpoint: step 5 restores.
  manager = ckpt_lib.make_manager(str(ckpt_dir))
  assert manager.latest_step() == 5 and list(manager.all_steps()) == [5]
  manager.close()
  task = rh.mlp_task()
  config = rh.crash_config(steps)
  state, meta = _restore(workdir, 5, _abstract_state(config, task))
  assert meta["step"] == 5 and int(state.step) == 5 and _finite(state)
  # Training resumes from step 5 over the debris and ends exactly where an uninterrupted run ends.
  summary = train_lib.train(config, str(workdir), **task)
  assert summary["start_step"] == 5
  train_lib.train(config, str(tmp_path / "straight"), **task)
  abstract = _abstract_state(config, task)
  a, _ = _restore(workdir, steps, abstract)
  b, _ = _restore(tmp_path / "straight", steps, abstract)
  chex.assert_trees_all_equal(a, b)


# --- 3. foreign or corrupt checkpoints ------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory, jax_cache):
  """A baseline MLP run stopped after step 11, with checkpoints at steps 5 and 10."""
  workdir = tmp_path_factory.mktemp("baseline_run")
  config = _config(jax_cache, "baseline")
  config.trainer.checkpoint_every = 5
  with pytest.raises(Stop):
    train_lib.train(config, str(workdir), hooks={"on_log": _stop_at(11)}, **rh.mlp_task())
  return config, workdir


def test_foreign_checkpoint_names_the_mismatched_leaves(tmp_path, baseline_run):
  config, pristine = baseline_run
  workdir = tmp_path / "run"
  shutil.copytree(pristine, workdir)
  before = _snapshot(workdir)
  # Another model size behind the same config (the width is not in the config): the code's
  # fingerprint tells it first; forced past that, the checkpoint's leaves do.
  with pytest.raises(ValueError, match="holds a run trained with other code: loss_fn and init_params changed"):
    train_lib.train(config, str(workdir), **rh.mlp_task(width=32))
  forced = config.copy_and_resolve_references()
  forced.resume = "force"
  with pytest.raises(ValueError) as e:
    train_lib.train(forced, str(workdir), **rh.mlp_task(width=32))
  msg = str(e.value)
  assert "does not match" in msg
  assert "params.dense_0.kernel: expected shape (4, 32), found (4, 16)" in msg, msg
  assert "opt_state" in msg and "checkpoints/10" in msg
  # Another state layout: a hybrid run asked to resume a baseline checkpoint (forced).
  hybrid = config.copy_and_resolve_references()
  hybrid.mode, hybrid.resume = "hybrid", "force"
  with pytest.raises(ValueError) as e:
    train_lib.train(hybrid, str(workdir), **rh.mlp_task())
  msg = str(e.value)
  assert "missing in checkpoint: " in msg and "method" in msg, msg
  assert "unexpected in checkpoint: " in msg and "e.g. nonfinite_streak" in msg, msg
  assert _snapshot(workdir) == before  # nothing deleted, nothing overwritten


def _truncate_data(step_dir):
  for dirpath, _, files in os.walk(step_dir / "state"):
    if os.path.basename(dirpath) == "d":
      for f in files:
        path = os.path.join(dirpath, f)
        os.truncate(path, os.path.getsize(path) // 2)


def _flip_data(step_dir):
  for dirpath, _, files in os.walk(step_dir / "state"):
    if os.path.basename(dirpath) == "d":
      for f in files:
        with open(os.path.join(dirpath, f), "r+b") as fh:
          b = bytearray(fh.read())
          b[len(b) // 4 :] = bytes(x ^ 0xFF for x in b[len(b) // 4 :])
          fh.seek(0)
          fh.write(b)


CORRUPTIONS = {
  "truncated data files": (_truncate_data, r"could not restore checkpoint .*checkpoints/10"),
  "corrupted data files": (_flip_data, r"could not restore checkpoint .*checkpoints/10"),
  "state metadata deleted": (lambda d: os.remove(d / "state" / "_METADATA"), r"checkpoints/10 has no readable 'state'"),
  "state item deleted": (lambda d: shutil.rmtree(d / "state"), r"checkpoints/10 has no readable 'state'"),
  "metadata garbage": (
    lambda d: (d / "meta" / "metadata").write_text("{not json"),
    r"could not read the metadata .*checkpoints/10",
  ),
  "metadata without step": (
    lambda d: (d / "meta" / "metadata").write_text('{"config": {}}'),
    r"checkpoints/10 has metadata without an integer 'step'",
  ),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_checkpoint_is_a_clear_error_and_changes_nothing(tmp_path, baseline_run, corruption):
  config, pristine = baseline_run
  workdir = tmp_path / "run"
  shutil.copytree(pristine, workdir)
  corrupt, pattern = CORRUPTIONS[corruption]
  corrupt(workdir / "checkpoints" / "10")
  before = _snapshot(workdir)
  with pytest.raises(ValueError, match=pattern) as e:
    train_lib.train(config, str(workdir), **rh.mlp_task())
  # The message says what to do, including which earlier checkpoint is intact.
  assert "nothing was deleted or changed" in str(e.value) and "[5]" in str(e.value), str(e.value)
  assert _snapshot(workdir) == before
  # Moving the corrupt one aside, as the message says, resumes from step 5.
  shutil.move(str(workdir / "checkpoints" / "10"), str(tmp_path / "aside"))
  _, meta = _restore(workdir, 5, _abstract_state(config, rh.mlp_task()))
  assert meta["step"] == 5


def test_a_corrupt_checkpoint_error_comes_without_stray_tracebacks(tmp_path, baseline_run, monkeypatch):
  # orbax closes its event loop when the first leaf's read fails, and the reads it abandoned call
  # back into the closed loop: each printed "RuntimeError: Event loop is closed" through
  # sys.unraisablehook, dozens of tracebacks after the message that matters.
  config, pristine = baseline_run
  workdir = tmp_path / "run"
  shutil.copytree(pristine, workdir)
  _truncate_data(workdir / "checkpoints" / "10")
  printed = []
  monkeypatch.setattr(sys, "unraisablehook", printed.append)
  for _ in range(3):  # the abandoned reads race the error: a few tries
    with pytest.raises(ValueError, match=r"could not restore checkpoint .*checkpoints/10"):
      train_lib.train(config, str(workdir), **rh.mlp_task())
  time.sleep(0.5)  # the last abandoned reads complete
  gc.collect()
  assert [f"{type(u.exc_value).__name__}: {u.exc_value}" for u in printed] == []
  # Any other unraisable exception still reaches the hook that was in place.
  sys.unraisablehook(types.SimpleNamespace(exc_value=RuntimeError("other"), object=None, exc_traceback=None))
  assert len(printed) == 1


_MICRO = {
  "model.n_layer": 1,
  "model.d_model": 32,
  "model.n_head": 2,
  "model.n_ctx": 32,
  "trainer.batch_size": 4,
  "trainer.eval_every": 0,
  "trainer.eval_batches": 1,
  "trainer.checkpoint_every": 2,
  "trainer.log_every": 1,
  "trainer.progress": False,
  "optim.warmup_steps": 0,
}


def _cli(jax_cache, *args, timeout=240):
  """`python -m experiments.gpt2_small` on a micro GPT-2 (the `_MICRO` overrides)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  flags = [f"--config.{k}={v}" for k, v in _MICRO.items()]
  return subprocess.run(
    [sys.executable, "-m", "experiments.gpt2_small", *flags, f"--config.trainer.compile_cache_dir={jax_cache}", *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
  )


def test_workdir_with_another_config_is_refused_unless_forced(tmp_path, baseline_run):
  config, pristine = baseline_run
  workdir = tmp_path / "run"
  shutil.copytree(pristine, workdir)
  before = _snapshot(workdir)
  # Another seed is another run: refused, naming the field with both values, and the way out.
  other = config.copy_and_resolve_references()
  other.seed = 1
  with pytest.raises(ValueError) as e:
    train_lib.train(other, str(workdir), **rh.mlp_task())
  msg = str(e.value)
  assert "seed: checkpoint has 0, config has 1" in msg and msg.count("checkpoint has") == 1, msg
  assert "--config.resume=force" in msg
  assert _snapshot(workdir) == before  # nothing deleted, nothing overwritten
  # Forced, it resumes from the checkpoint at step 10: its log continues with steps 11 and 12.
  other.resume = "force"
  logged = []
  with pytest.raises(Stop):
    train_lib.train(
      other,
      str(workdir),
      hooks={"on_log": lambda step, record: (logged.append(step), _stop_at(12)(step, record))},
      **rh.mlp_task(),
    )
  assert logged == [11, 12]


# The CLI's own process (7-8 s): the slow set, which CI runs; `train()`'s refusal of a diverged run is
# the default suite's (`test_persistent_nan_stops_the_run_and_keeps_the_last_good_checkpoint`).
@pytest.mark.slow
def test_cli_stops_a_diverging_run_with_a_clear_error(tmp_path, jax_cache):
  # lr = 1e9: the first update throws the weights to ~1e9, every later loss is infinite.
  workdir = tmp_path / "run"
  r = _cli(
    jax_cache,
    f"--workdir={workdir}",
    "--config.trainer.steps=40",
    "--config.optim.learning_rate=1e9",
    "--config.trainer.max_nonfinite_steps=4",
  )
  assert r.returncode == 3, (r.stdout[-2000:], r.stderr[-3000:])
  assert "error: training diverged" in r.stderr, r.stderr[-3000:]
  assert "max_nonfinite_steps=4" in r.stderr and "learning_rate" in r.stderr
  # Every step from the second on was non-finite: the checkpoints due at steps 2 and 4 were skipped
  # (no checkpoint of a diverged state), and the run stopped at step 5 without a summary.
  records = _records(workdir)
  assert [records[s]["nonfinite_streak"] for s in sorted(records)] == [0, 1, 2, 3, 4], records
  assert "step 2: checkpoint skipped" in r.stdout and "step 4: checkpoint skipped" in r.stdout
  assert not [n for n in os.listdir(workdir / "checkpoints") if n[0].isdigit()]
  assert not os.path.exists(workdir / "summary.json")


# --- 4. numerical faults --------------------------------------------------------------------------

SPIKE = 1e6  # a loss (and gradient) factor far beyond the loss-spike and explosion thresholds
FAULTS = {"nan": np.nan, "inf": np.inf, "spike": SPIKE, "spike_micro": SPIKE}


@pytest.fixture(scope="module")
def hybrid(jax_cache):
  """A HybridDriver for the module's hybrid config (its step programs come from the cache)."""
  config = _config(jax_cache)
  train_lib.enable_compile_cache(config.trainer)
  task = rh.mlp_task()
  driver = train_lib.make_driver(config, init_params=task["init_params"], loss_fn=task["loss_fn"])
  assert isinstance(driver, drivers.HybridDriver) and driver.dispatch == "switch"
  return config, driver, task


def _batch(task, i, scale=1.0):
  b = task["train_batch"](i)
  b["scale"] = np.float32(scale)
  return b


def _validates(c, config, plan) -> bool:
  """Whether the next predicted step measures the loss (as `predict_step` decides)."""
  k = min(max(int(c.steps_in_phase) - int(plan.plan_offset), 0), config.hybrid.max_predict_steps - 1)
  return (k + 1) % config.hybrid.velocity.validate_every == 0 or int(c.steps_in_phase) + 1 >= int(c.horizon)


@pytest.mark.slow
def test_nan_inf_and_spikes_in_every_phase_are_survived(hybrid):
  # NaN and Inf losses and a gradient spike, each injected in WARMUP, FULL, PREDICT and CORRECT (in
  # PREDICT at a validating step, and the spike also at a micro-correction): the params never hold
  # a non-finite value, every fault is counted by the health monitor (or, for a diverged
  # prediction, rolled back), and training goes on into PREDICT again.
  config, driver, task = hybrid
  state = _fresh_state(driver)
  pending = {(p, k) for p in PHASES.values() for k in ("nan", "inf", "spike")}
  pending.add((PREDICT, "spike_micro"))
  landed, last, losses = [], -10, []
  cooldown = config.hybrid.health.cooldown_steps
  for i in range(700):
    c, plan = jax.device_get((state.controller, state.method.plan))
    phase, branch = int(c.phase), int(c.next_branch)
    kind = None
    for k in ("nan", "inf", "spike", "spike_micro"):
      if (phase, k) not in pending or i - last < 3:
        continue
      real = branch != Branch.PREDICT_STEP
      if k == "spike_micro" and not (phase == PREDICT and branch == Branch.FULL_STEP):
        continue
      if (
        phase == PREDICT and k != "spike_micro" and not (branch == Branch.PREDICT_STEP and _validates(c, config, plan))
      ):
        continue
      if k == "spike" and real and int(c.real_count) < controller_lib.HEALTH_WARMUP:
        continue  # the health statistics are not armed yet
      kind = k
      break
    before = jax.device_get(state.train.params)
    state, m = _step(driver, state, _batch(task, i, FAULTS[kind] if kind else 1.0))
    m, c2 = jax.device_get(m), jax.device_get(state.controller)
    assert _finite(state.train.params) and _finite(state.method.velocity), f"non-finite state at step {i}"
    assert _finite(state.train.opt_state)
    if not kind:
      if m["measured"]:  # an unvalidated predicted step has no loss (NaN)
        losses.append(float(m["loss"]))
      else:
        assert np.isnan(m["loss"]) and np.isfinite(m["predicted_loss"]), i
      if not pending and phase == PREDICT and i - last > 5:
        break  # predicting again after the last fault
      continue
    what = f"{kind} in {PHASES_BY_ID[phase]} (branch {branch}) at step {i}"
    events = c2.events - c.events
    assert bool(m["measured"]), what
    if kind in ("nan", "inf"):
      assert not np.isfinite(m["loss"]), what
      assert events[0] == 1, (what, events)
      assert int(c2.cooldown) == cooldown, what
      if branch == Branch.FULL_STEP and phase != PREDICT:  # the update was skipped
        chex.assert_trees_all_equal(jax.device_get(state.train.params), before)
        assert int(state.train.nonfinite_streak) == 1
    elif branch != Branch.PREDICT_STEP:  # a spike in a real step: explosion and/or loss spike
      assert events[1] + events[2] >= 1, (what, events)
      assert int(c2.cooldown) == cooldown, what
    if phase == PREDICT:  # the predicted segment ends, and is rolled back if it diverged
      assert int(c2.phase) == CORRECT, what
      if branch == Branch.PREDICT_STEP:
        assert int(c2.rollbacks) == int(c.rollbacks) + 1, what
    if phase in (FULL, CORRECT):
      assert int(c2.phase) == FULL, what
    pending.discard((phase, kind))
    landed.append(what)
    last = i
  assert not pending, f"faults never injected: {pending}; landed: {landed}"
  assert int(c2.phase) == PREDICT, "training did not return to PREDICT after the faults"
  assert int(c2.events[0]) == 8  # every NaN/Inf, and nothing else, was a non-finite event
  assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])  # and it kept learning


def _predict_state(state, ctx, plan_alpha, start_loss=1e3):
  """`state` switched to the start of a PREDICT phase with a given plan and a high start loss."""
  hmax = ctx.control.max_predict_steps
  # Distinct buffers for every leaf: the state is donated, and a buffer cannot be donated twice.
  big = lambda: jnp.full((hmax,), np.log(start_loss), jnp.float32)  # noqa: E731
  c = state.controller.replace(
    phase=jnp.int32(PREDICT),
    steps_in_phase=jnp.int32(0),
    horizon=jnp.int32(hmax),
    start_logloss=jnp.float32(np.log(start_loss)),
    next_branch=jnp.int32(Branch.PREDICT_STEP),
    cooldown=jnp.int32(0),
    consecutive_failures=jnp.int32(0),
  )
  plan = state.method.plan.replace(
    plan_offset=jnp.int32(0),
    plan_alpha=jnp.asarray(plan_alpha, jnp.float32),
    plan_logloss=big(),
    plan_raw_logloss=big(),
    alpha_since_good=jnp.zeros((ctx.groups.n_groups,)),
    rollback_alpha=jnp.zeros((ctx.groups.n_groups,)),
  )
  # Committed, as the step's own outputs are: the same compiled program runs it.
  return jax.device_put(state.replace(controller=c, method=state.method.replace(plan=plan)), jax.devices()[0])


def _fresh_state(driver):
  """`driver.init_state()` committed to the device, as `trainer.train` does: the same programs."""
  return jax.device_put(driver.init_state(), jax.devices()[0])


def _step(driver, state, batch):
  """One step through `driver.run`; returns (state, metrics on the host). The per-step trace the
  driver keeps for the logs is emptied through `records`, as a log would."""
  state, m = driver.run(state, [batch])
  m = jax.device_get(m)
  driver.records(m, driver.log_view(state))
  return state, m


def _warm_state(driver, task, n=30):
  state = _fresh_state(driver)
  for i in range(n):
    state, _ = _step(driver, state, _batch(task, 1000 + i))
  return state


def test_diverged_prediction_is_rolled_back_to_the_validated_point(hybrid):
  # A PREDICT phase: two predicted steps (the second validated: good), a micro-correction, then a
  # predicted step whose validation diverges (a loss spike). The CORRECT entry subtracts exactly
  # the diverged step (sum of its alphas times the velocity): the params return to where they were
  # after the micro-correction, up to float rounding, keeping the validated part. The entry's own
  # update is made non-finite (skipped), so its params are the rolled-back ones.
  config, driver, task = hybrid
  ctx = driver.ctx
  assert config.hybrid.correction_interval == 2 and config.hybrid.velocity.validate_every == 2
  g = ctx.groups.n_groups
  state = _predict_state(
    _warm_state(driver, task),
    ctx,
    np.linspace(0.5, 1.5, ctx.control.max_predict_steps * g).reshape(ctx.control.max_predict_steps, g),
  )
  start = jax.device_get(state.train.params)
  state, m = _step(driver, state, _batch(task, 0))  # predicted, not validated
  assert not bool(m["measured"])
  state, m = _step(driver, state, _batch(task, 1))  # predicted, validated: good
  assert bool(m["measured"]) and int(state.controller.phase) == PREDICT
  assert int(state.controller.next_branch) == Branch.FULL_STEP
  state, m = _step(driver, state, _batch(task, 2))  # micro-correction (a real step)
  assert float(m["grad_norm"]) > 0
  kept = jax.device_get(state.train.params)
  rollbacks = int(state.controller.rollbacks)
  state, m = _step(driver, state, _batch(task, 3, SPIKE))  # predicted, validated: diverged
  assert bool(m["measured"]) and int(state.controller.phase) == CORRECT
  assert int(state.controller.rollbacks) == rollbacks + 1
  moved = jax.device_get(state.train.params)
  for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(kept)):
    assert np.any(a != b), "the diverged predicted step did not move the params"
  state, m = _step(driver, state, _batch(task, 4, np.nan))  # CORRECT entry: roll back, skip update
  assert int(state.controller.events[0]) >= 1
  back = jax.device_get(state.train.params)
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(kept))
  chex.assert_trees_all_close(back, kept, rtol=1e-6, atol=1e-6 * scale)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(start)):
    assert np.any(a != b), "the validated part of the segment was rolled back too"


def test_non_finite_plan_never_moves_the_params(hybrid):
  config, driver, task = hybrid
  ctx = driver.ctx
  alpha = np.ones((ctx.control.max_predict_steps, ctx.groups.n_groups), np.float32)
  alpha[0, 0] = np.nan
  state = _predict_state(_warm_state(driver, task, n=5), ctx, alpha)
  before = jax.device_get(state.train.params)
  events = int(state.controller.events[0])
  state, _ = _step(driver, state, _batch(task, 0))
  chex.assert_trees_all_equal(jax.device_get(state.train.params), before)
  assert int(state.controller.phase) == CORRECT and int(state.controller.events[0]) == events + 1


# The hybrid run is in the slow set (CI runs it): the default suite keeps the baseline's, and the
# hybrid trainer's own stop on non-finite events (`test_hybrid_stops_after_max_events_non_finite_events`).
@pytest.mark.parametrize("mode", ["baseline", pytest.param("hybrid", marks=pytest.mark.slow)])
def test_persistent_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, jax_cache, mode):
  config = _config(jax_cache, mode)
  config.trainer.checkpoint_every = 5
  config.trainer.max_nonfinite_steps = 6
  first_bad = 12  # the loss is NaN from step 12 on (batch index 11)
  task = rh.mlp_task(fault=lambda i: np.nan if i + 1 >= first_bad else 1.0)
  with pytest.raises(train_lib.TrainingDiverged) as e:
    train_lib.train(config, str(tmp_path / "run"), **task)
  detected = first_bad + config.trainer.max_nonfinite_steps - 1
  msg = str(e.value)
  assert f"(up to step {detected})" in msg and "the last 6 steps" in msg, msg
  assert "--config.trainer.max_nonfinite_steps=6" in msg and "learning_rate" in msg
  assert "step 10, is kept" in msg, msg
  manager = ckpt_lib.make_manager(str(tmp_path / "run" / "checkpoints"))
  assert list(manager.all_steps()) == [5, 10]  # step 15 was inside the NaN streak: not saved
  manager.close()
  state, meta = _restore(tmp_path / "run", 10, _abstract_state(config, task))
  assert meta["step"] == 10 and _finite(state)
  records = _records(tmp_path / "run")
  assert max(records) == detected
  streaks = [records[s]["nonfinite_streak"] for s in range(first_bad - 1, detected + 1)]
  assert streaks == list(range(7))


def test_hybrid_stops_after_max_events_non_finite_events(tmp_path, jax_cache):
  config = _config(jax_cache)
  config.hybrid.health.max_events = 3
  task = rh.mlp_task(fault=lambda i: np.nan if i in (4, 8, 12, 16) else 1.0)  # never 2 in a row
  with pytest.raises(
    train_lib.TrainingDiverged,
    match=r"3 non-finite events by step 13 .*"
    r"hybrid\.health\.max_events=3",
  ):
    train_lib.train(config, str(tmp_path / "run"), **task)


# --- 5. bad input ---------------------------------------------------------------------------------

_VALUES = st.one_of(
  st.integers(-(2**40), 2**40),
  st.floats(allow_nan=True, allow_infinity=True),
  st.booleans(),
  st.none(),
  st.text(max_size=6),
  st.sampled_from(["auto", "hybrid", "adamw", "kind", "host"]),
  st.lists(st.integers(), max_size=2),
  st.integers(0, 64),
  st.floats(0.0, 1.0),
)


def _set(d: dict, dotted: str, value) -> None:
  *parents, leaf = dotted.split(".")
  for p in parents:
    d = d[p]
  d[leaf] = value


_KNOWN_FIELDS = sorted(preflight.declared_fields())


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(st.lists(st.tuples(st.sampled_from(_KNOWN_FIELDS), _VALUES), min_size=1, max_size=3))
def test_property_random_configs_get_a_named_error_or_work(mutations):
  base = micro_config(mode="hybrid", steps=20)
  d = base.to_dict()
  for name, value in mutations:
    _set(d, name, value)
  config = ml_collections.ConfigDict(d)  # not type-locked: any value reaches validate
  names = {name for name, _ in mutations}
  try:
    preflight.validate(config)
  except ValueError as e:
    assert any(n in str(e) for n in names), (str(e), names)
    return
  # Accepted: everything built from the config before training must accept it too.
  from hybridjax.models import gpt2

  gpt2.GPT2Config(**config.model.to_dict()).validate()
  if config.optim.name not in optim.BUILTIN_OPTIMIZERS:
    # A name of a user's optimizer: without one given to train(tx=...), a named error before anything compiles.
    with pytest.raises(ValueError, match=r"optim\.name"):
      optim.resolve_optimizer(config.optim, {"w": jnp.ones((3, 4))})
    return
  tx = optim.make_optimizer(config.optim)
  params = {"w": jnp.ones((3, 4)), "b": jnp.zeros((4,))}
  tx.update(params, tx.init(params), params)
  schedule = optim.make_schedule(config.optim, config.trainer.steps)
  assert np.isfinite(float(optim.learning_rate(schedule, config.trainer.steps)))
  drivers.make_context(
    config.hybrid,
    loss_fn=lambda p, b: (jnp.sum(p["w"]), {}),
    tx=tx,
    params_shape=params,
    total_steps=config.trainer.steps,
    grad_accum=config.trainer.grad_accum,
  )
  assert config.trainer.batch_size % config.trainer.grad_accum == 0


@pytest.mark.parametrize(
  "relation",
  [
    ("hybrid.warmup_steps", 20, "hybrid.warmup_steps"),
    ("optim.decay_steps", 3, "optim.decay_steps"),
    ("hybrid.velocity.window", 32, "hybrid.velocity.window"),
    ("trainer.max_nonfinite_steps", 0, "trainer.max_nonfinite_steps"),
    ("hybrid.health.max_events", 0, "hybrid.health.max_events"),
    ("preset", 7, "preset"),
  ],
)
def test_config_relations_name_the_fields(relation):
  field, value, match = relation
  c = micro_config(mode="hybrid", steps=20)
  with c.unlocked():
    _set_cfg(c, field, value)
  with pytest.raises(ValueError, match=match.replace(".", r"\.")):
    preflight.validate(c)


def _set_cfg(c, dotted, value):
  *parents, leaf = dotted.split(".")
  for p in parents:
    c = c[p]
  if type(c[leaf]) is not type(value):  # a wrong type needs the field replaced
    del c[leaf]
  c[leaf] = value


def test_every_config_field_is_validated():
  # A field added to a config without a validator is a field whose bad values reach JAX.
  from experiments.configs import gpt2_small

  flat = config_lib.flatten(gpt2_small.get_config("tiny"))
  known = preflight.declared_fields()
  assert set(flat) <= set(known), sorted(set(flat) - set(known))


@pytest.mark.parametrize("kind", ["missing", "empty", "blank", "binary", "folder of binaries"])
def test_bad_corpus_is_refused_naming_data_path(tmp_path, kind):
  path = tmp_path / "corpus.txt"
  if kind == "empty":
    path.write_bytes(b"")
  elif kind == "blank":
    path.write_text(" \n\t\n")
  elif kind == "binary":
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
  elif kind == "folder of binaries":
    path.mkdir()
    (path / "a.bin").write_bytes(np.arange(1000, dtype=np.int32).tobytes())
  c = micro_config()
  c.data.path = str(path)
  with pytest.raises((ValueError, FileNotFoundError), match=r"data\.path"):
    experiment.build_task(c)


_MICRO_LOSS: dict = {}


def _token_bytes(ids: list[int]) -> bytes:
  return np.asarray(ids, np.uint16).tobytes()


def _micro_loss():
  """A jitted loss of a micro GPT-2 (byte vocab), batch 2 x 8, compiled once."""
  if not _MICRO_LOSS:
    from hybridjax.models import gpt2

    cfg = gpt2.GPT2Config(vocab_size=256, n_ctx=8, n_layer=1, n_head=2, d_model=16)
    model = gpt2.GPT2(cfg)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    loss = jax.jit(gpt2.make_loss_fn(model))
    _MICRO_LOSS.update(params=params, loss=lambda b: loss(params, b)[0])
  return _MICRO_LOSS["loss"]


@hypothesis.settings(max_examples=30, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(
  raw=st.one_of(
    st.binary(max_size=120),  # raw garbage: odd sizes, ids far beyond the vocabulary
    st.lists(st.integers(0, 300), max_size=60).map(_token_bytes),  # a few ids too large
    st.lists(st.integers(0, 255), min_size=9, max_size=60).map(_token_bytes),
  ),  # all valid
  seed=st.integers(0, 2**31),
  step=st.integers(0, 10**6),
)
def test_property_random_token_files_give_a_clear_error_or_a_finite_loss(tmp_path_factory, raw, seed, step):
  # Random bytes as a token file: refused with a ValueError (odd size, empty, too short, ids beyond
  # the byte vocabulary) or batches whose ids fit the model, whose loss is then finite.
  path = tmp_path_factory.mktemp("tokens") / "train.bin"
  path.write_bytes(raw)
  try:
    tokens = data_lib.load_tokens(path)
    batch = data_lib.get_batch(tokens, seed=seed, step=step, batch_size=2, seq_len=8, vocab_size=256)
  except ValueError as e:
    assert str(e)
    ids = np.frombuffer(raw[: len(raw) // 2 * 2], np.uint16)
    assert len(raw) % 2 or len(ids) < 9 or "model.vocab_size" in str(e), str(e)
    return
  assert len(raw) % 2 == 0 and batch["inputs"].max() < 256
  hypothesis.event("batch reached the model")
  assert math.isfinite(float(_micro_loss()(batch)))


# --- 6. soak --------------------------------------------------------------------------------------


@pytest.mark.slow  # 500 steps with the soak script's readings and checkpoints (test_memory: 1000 steps)
def test_soak_500_steps_memory_flat(tmp_path, jax_cache):
  # The soak script's loop on the module's hybrid MLP: 500 steps, a checkpoint every 100. The live
  # device arrays are the same at every reading (exact), and the RSS grows by little.
  config = _config(jax_cache)
  config.trainer.checkpoint_every = 100
  config.trainer.max_to_keep = 2
  report = soak.run_soak(config, str(tmp_path / "soak"), rh.mlp_task(), report_every=50)
  readings = report["readings"]
  assert [r["step"] for r in readings] == list(range(50, STEPS + 1, 50))
  print(soak.format_report(report))
  assert len({(r["live_arrays"], r["live_bytes"]) for r in readings}) == 1, readings
  # RSS (read after a heap trim): after the first readings (compiles, first executions, first
  # save) it settles; from its lowest point on, growth over the run stays under 5%.
  rss = [r["rss_bytes"] for r in readings]
  low = min(rss[1:])
  assert (rss[-1] - low) / low < 0.05 and (max(rss[rss.index(low) :]) - low) / low < 0.05, rss
  assert report["health_events"] == sum(report["summary"]["health_events"].values()) == 0
  assert report["summary"]["phase_steps"]["PREDICT"] > 0
  with open(tmp_path / "soak" / "soak.json") as f:
    assert json.load(f)["readings"] == readings
  manager = ckpt_lib.make_manager(str(tmp_path / "soak" / "checkpoints"))
  assert list(manager.all_steps()) == [400, 500]
  manager.close()
