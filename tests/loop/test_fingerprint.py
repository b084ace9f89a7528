"""A run's code fingerprint (`hybridjax.loop.fingerprint`): what changes it, and what a resume does
with it: the run's own code changed is refused (unless resume='force', which records both),
hybridjax's is said and recorded, a checkpoint without one resumes with a note."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys

import numpy as np
import optax
import pytest
import reliability_helper as rh

from hybridjax import registry
from hybridjax.loop import fingerprint as fingerprint_lib
from hybridjax.loop import train as train_lib
from hybridjax.models import mlp


def _script(source: str, **values) -> dict:
  """The names `source` defines when run as a script (`__main__`), as a user's script or notebook does."""
  namespace = {"__name__": "__main__", "optax": optax, **values}
  exec(compile(source, "<script>", "exec"), namespace)  # noqa: S102 (a user's script, made here)
  return namespace


def test_a_scripts_lambda_is_hashed_by_its_code_its_closure_and_the_globals_it_reads():
  digest = fingerprint_lib.callable_digest
  tx = digest(_script("tx = lambda lr: optax.adam(lr)")["tx"])
  assert digest(_script("tx = lambda lr: optax.adam(lr)")["tx"]) == tx  # the same code, run again
  assert digest(_script("tx = lambda lr: optax.adam(0.5 * lr)")["tx"]) != tx  # its code edited
  assert digest(_script("tx = lambda lr: optax.adamw(lr)")["tx"]) != tx  # another function called
  # A global it reads, and a value it closes over, are part of it.
  scaled = "def make(s):\n  return lambda lr: optax.adam(s * lr * SCALE)\ntx = make(2.0)"
  base = digest(_script(scaled, SCALE=1.0)["tx"])
  assert digest(_script(scaled, SCALE=1.0)["tx"]) == base
  assert digest(_script(scaled, SCALE=3.0)["tx"]) != base
  assert digest(_script(scaled.replace("make(2.0)", "make(4.0)"), SCALE=1.0)["tx"]) != base
  # An unrelated function of the same script is not.
  assert digest(_script(scaled + "\ndef other():\n  return 1", SCALE=1.0)["tx"]) == base


def test_values_are_hashed_by_content_optax_hyperparameters_and_flax_modules_included():
  digest = fingerprint_lib.callable_digest
  a = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-4)
  assert digest(a) == digest(optax.inject_hyperparams(optax.adamw)(learning_rate=1e-4))
  assert digest(a) != digest(optax.inject_hyperparams(optax.adamw)(learning_rate=2e-4))
  # hybridjax's own loss, closing over the user's model: the model's fields tell two models apart.
  loss = lambda width: mlp.make_loss_fn(mlp.MLP(features=(width,), n_out=1))  # noqa: E731
  assert digest(loss(16)) == digest(loss(16)) != digest(loss(32))
  # Arrays by their bytes.
  holding = lambda a: lambda: a  # noqa: E731
  x = np.arange(12.0)
  assert digest(holding(x)) == digest(holding(x.copy())) != digest(holding(x + 1))


def test_a_users_module_is_hashed_by_its_code(tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(str(tmp_path))
  path = tmp_path / "my_task_fp.py"
  path.write_text("def loss_fn(params, batch):\n  return params * 2, {}\n")
  module = importlib.import_module("my_task_fp")
  before = fingerprint_lib.callable_digest(module.loss_fn)
  path.write_text("# a comment\ndef loss_fn(params, batch):\n  '''Doc.'''\n  return params * 2, {}\n")
  assert fingerprint_lib.callable_digest(importlib.reload(module).loss_fn) == before  # comments, docstrings
  path.write_text("def loss_fn(params, batch):\n  return params * 3, {}\n")
  assert fingerprint_lib.callable_digest(importlib.reload(module).loss_fn) != before
  sys.modules.pop("my_task_fp")


def test_the_fingerprint_names_the_run_s_own_parts_and_hybridjax_apart():
  task = rh.mlp_task()
  parts = {k: task[k] for k in ("loss_fn", "train_batch", "init_params")} | {"tx": None}
  code = fingerprint_lib.fingerprint(parts, registry.load_method("velocity"), "hybrid", train_lib.__name__)
  assert sorted(code["own"]) == ["init_params", "loss_fn", "train_batch"]  # tx None: the config's optimizer
  other = rh.mlp_task(width=32)  # another model behind the same config
  changed = fingerprint_lib.fingerprint(
    {k: other[k] for k in ("loss_fn", "train_batch", "init_params")},
    registry.load_method("velocity"),
    "hybrid",
    train_lib.__name__,
  )
  assert fingerprint_lib.compare(code, changed) == (["loss_fn", "init_params"], False)
  assert fingerprint_lib.compare(code, code) == ([], False)
  assert fingerprint_lib.compare(code, {**code, "hybridjax": "0"}) == ([], True)
  assert fingerprint_lib.describe_parts(["loss_fn", "tx"]) == "loss_fn and tx"


def _snapshot(root) -> dict[str, str]:
  out = {}
  for dirpath, _, filenames in os.walk(root):
    for f in filenames:
      with open(os.path.join(dirpath, f), "rb") as fh:
        out[os.path.relpath(os.path.join(dirpath, f), root)] = hashlib.sha256(fh.read()).hexdigest()
  return out


class _Stop(Exception):
  pass


def _stop_at(step):
  def on_log(done, record):
    if done >= step:
      raise _Stop()

  return on_log


@pytest.mark.slow  # trains the MLP three times
def test_a_resume_whose_own_code_changed_is_refused_unless_forced(tmp_path, capsys):
  config = rh.mlp_config("baseline", steps=20)
  config.trainer.checkpoint_every = 5
  workdir = str(tmp_path / "run")
  task = rh.mlp_task()
  with pytest.raises(_Stop):
    train_lib.train(config, workdir, hooks={"on_log": _stop_at(12)}, **task)
  # The loss edited (doubled), then train() again on the same workdir: refused, nothing written.

  def doubled(params, batch):
    loss, aux = task["loss_fn"](params, batch)
    return 2 * loss, aux

  edited = dict(task, loss_fn=doubled)
  before = _snapshot(workdir)
  with pytest.raises(ValueError) as e:
    train_lib.train(config, workdir, **edited)
  assert str(e.value).startswith(
    f"--workdir {workdir} holds a run trained with other code: loss_fn changed since its checkpoint at step 10. "
    "Resuming would train the rest of the run on other code than its first 10 steps"
  ), e.value
  assert "--config.resume=force" in str(e.value)
  assert _snapshot(workdir) == before
  # Forced: it goes on, and the record keeps both fingerprints.
  config.resume = "force"
  summary = train_lib.train(config, workdir, **edited)
  (change,) = summary["code_changes"]
  assert change["step"] == 10 and change["changed"] == ["loss_fn"]
  assert change["from"]["own"]["loss_fn"] != change["to"]["own"]["loss_fn"] == summary["code"]["own"]["loss_fn"]
  assert (
    "WARNING: --config.resume=force: resuming at step 10 with other code (loss_fn changed)" in capsys.readouterr().out
  )
  # The finished run, asked again with the original loss: refused (it would report the edited loss's results).
  config.resume = "auto"
  with pytest.raises(
    ValueError, match="holds a run trained with other code: loss_fn changed since its checkpoint at step 20"
  ):
    train_lib.train(config, workdir, **task)
  # Forced on the finished run: nothing is trained, so nothing is recorded, and it says so.
  config.resume = "force"
  capsys.readouterr()
  with open(os.path.join(workdir, "summary.json")) as f:
    written = json.load(f)
  assert written["code"] == summary["code"] and train_lib.train(config, workdir, **task) == written
  out = capsys.readouterr().out
  assert "(loss_fn changed); the run has finished: nothing is trained, and nothing recorded" in out, out
  assert "recorded as code_changes" not in out
  with open(os.path.join(workdir, "summary.json")) as f:
    assert json.load(f) == written


@pytest.mark.slow  # trains the MLP twice
def test_a_change_of_hybridjax_s_own_code_is_said_and_recorded(tmp_path, capsys, monkeypatch):
  config = rh.mlp_config("baseline", steps=20)
  config.trainer.checkpoint_every = 5
  workdir = str(tmp_path / "run")
  with pytest.raises(_Stop):
    train_lib.train(config, workdir, hooks={"on_log": _stop_at(12)}, **rh.mlp_task())
  real = fingerprint_lib.fingerprint
  monkeypatch.setattr(fingerprint_lib, "fingerprint", lambda *a, **k: {**real(*a, **k), "hybridjax": "another version"})
  summary = train_lib.train(config, workdir, **rh.mlp_task())
  assert summary["start_step"] == 10 and summary["code_changes"][0]["changed"] == ["hybridjax"]
  assert "note: hybridjax's own code changed since the checkpoint at step 10" in capsys.readouterr().out
