"""The trainer's refusals of what a run would silently ignore or change (`hybridjax.preflight`):
a resume with another `trainer.steps` where the schedule depends on it, an empty eval set, hybrid
settings the run does not read, a misspelt method hook; and `export_params`' warning for a run that
stopped early."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import types
import warnings

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import reliability_helper as rh
from conftest import method_package

import hybridjax
from hybridjax import config as config_lib
from hybridjax import optim, preflight, registry, schema
from hybridjax.hybrid.context import ControllerSettings
from hybridjax.loop import drivers
from hybridjax.loop import resume as resume_lib
from hybridjax.loop import train as train_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lrs(optim_cfg, total: int, upto: int) -> np.ndarray:
  return np.asarray(optim.learning_rate(optim.make_schedule(optim_cfg, total), jnp.arange(upto)))


# --- which runs may change trainer.steps -----------------------------------------------------------


def test_the_schedule_depends_on_the_length_exactly_when_steps_dependence_says():
  """The rule matches the schedule: those it calls independent give the same learning rate at every
  step for 300 and 600 steps, the others do not."""
  cases = {
    "cosine over the run": {},
    "wsd over the run": {"schedule": "wsd"},
    "cosine with its own decay_steps": {"decay_steps": 400},
    "wsd with its own decay_steps": {"schedule": "wsd", "decay_steps": 400},
    "constant after its warm-up": {"min_lr_ratio": 1.0},
    "constant wsd": {"schedule": "wsd", "min_lr_ratio": 1.0},
  }
  for name, fields in cases.items():
    c = config_lib.default_config()
    c.optim.update(fields)
    depends = bool(resume_lib.steps_dependence(c))
    same = np.array_equal(_lrs(c.optim, 300, 300), _lrs(c.optim, 600, 300))
    assert depends == (not same), name
  assert resume_lib.steps_dependence(config_lib.default_config())  # the default decays over the run
  hybrid = config_lib.default_config("hybrid")
  hybrid.optim.decay_steps = 400
  assert "method 'velocity'" in " ".join(resume_lib.steps_dependence(hybrid))  # its steps read the length


def test_a_resume_with_other_steps_is_refused_with_the_fixes():
  c = config_lib.default_config()
  c.optim.update(learning_rate=3e-3, warmup_steps=50)
  c.trainer.steps = 600
  error = resume_lib.steps_change_error(c, 300, 300, "runs/x", finished=True)
  assert "finished its 300 steps" in error and "--config.trainer.steps=300 to resume it" in error
  assert "--config.resume=force" in error and "a new --workdir" in error
  # The jump it would make, from the schedules themselves.
  lr_300, lr_600 = _lrs(c.optim, 300, 301)[300], _lrs(c.optim, 600, 301)[300]
  assert lr_600 > 5 * lr_300
  assert f"would be {lr_600:.4g} instead of {lr_300:.4g}" in error
  assert resume_lib.steps_change_error(c, 600, 300, "runs/x") is None  # the same steps
  c.optim.decay_steps = 1000
  assert resume_lib.steps_change_error(c, 300, 300, "runs/x") is None  # nothing depends on it
  c.trainer.steps = 100  # a checkpoint past the end: nothing to train, whatever resume says
  c.resume = "force"
  assert "past --config.trainer.steps=100" in resume_lib.steps_change_error(c, 300, 200, "runs/x")


def _workdir_run(tmp_path, steps, **kw):
  c = rh.mlp_config("baseline", steps=steps)
  c.trainer.update(log_every=10, checkpoint_every=10)
  for k, v in kw.items():
    c.update_from_flattened_dict({k: v})
  return c


@pytest.mark.slow  # five short runs
def test_train_refuses_resuming_with_other_steps_and_force_records_it(tmp_path, capsys):
  workdir = str(tmp_path / "run")
  done = train_lib.train(_workdir_run(tmp_path, 30), workdir, **rh.mlp_task())
  capsys.readouterr()
  # More steps: refused, nothing written.
  with pytest.raises(ValueError, match=r"finished its 30 steps .*--config\.trainer\.steps=30 to resume it"):
    train_lib.train(_workdir_run(tmp_path, 60), workdir, **rh.mlp_task())
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["10", "20", "30"]
  # Fewer steps: the finished run's summary, with its own count.
  again = train_lib.train(_workdir_run(tmp_path, 10), workdir, **rh.mlp_task())
  out = capsys.readouterr().out
  assert again == done and "already finished its 30 steps (--config.trainer.steps=10 asks for no more)" in out
  assert "raise --config.trainer.steps" not in out
  # The same steps: nothing to do, and a larger value is not suggested (it changes the schedule).
  train_lib.train(_workdir_run(tmp_path, 30), workdir, **rh.mlp_task())
  assert "use a new --workdir with a larger --config.trainer.steps" in capsys.readouterr().out
  # resume='force': continued, and recorded in the summary and the checkpoints.
  forced = train_lib.train(_workdir_run(tmp_path, 60, resume="force"), workdir, **rh.mlp_task())
  assert forced["start_step"] == 30 and forced["steps_changes"] == [{"step": 30, "from": 30, "to": 60}]
  assert "WARNING: --config.resume=force" in capsys.readouterr().out
  # A schedule of its own length: more steps continue it, with no force and no record.
  other = str(tmp_path / "fixed")
  train_lib.train(_workdir_run(tmp_path, 30, **{"optim.decay_steps": 60}), other, **rh.mlp_task())
  longer = train_lib.train(_workdir_run(tmp_path, 40, **{"optim.decay_steps": 60}), other, **rh.mlp_task())
  assert longer["start_step"] == 30 and longer["steps"] == 40 and "steps_changes" not in longer


# --- eval_batches and export_params ----------------------------------------------------------------


def test_an_empty_eval_set_is_refused_before_the_workdir_is_made(tmp_path):
  task = {**rh.mlp_task(), "eval_batches": []}
  with pytest.raises(ValueError, match=r"train\(eval_batches=\[\]\).*at least one fixed held-out batch"):
    train_lib.train(rh.mlp_config("baseline", steps=20), str(tmp_path / "run"), **task)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow  # two short runs
def test_export_params_warns_when_the_run_stopped_before_its_end(tmp_path):
  class Stop(Exception):
    pass

  def stop_at_20(step, record):
    if step == 20:
      raise Stop

  workdir = str(tmp_path / "run")
  with pytest.raises(Stop):  # the log at step 20 comes before its checkpoint: the latest is step 10
    train_lib.train(_workdir_run(tmp_path, 30), workdir, hooks={"on_log": stop_at_20}, **rh.mlp_task())
  with pytest.warns(UserWarning, match=r"stopped at step 10 of its 30 \(--config\.trainer\.steps\).*pass step=10"):
    early = hybridjax.export_params(workdir, averaged=False)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    chex.assert_trees_all_equal(hybridjax.export_params(workdir, step=10, averaged=False), early)  # asked for
    train_lib.train(_workdir_run(tmp_path, 30), workdir, **rh.mlp_task())  # finished: no warning
    hybridjax.export_params(workdir, averaged=False)


# --- hybrid settings the run does not read ---------------------------------------------------------


def _errors(c, control=None, references=None):
  c = config_lib.with_method_block(c)
  method = config_lib.resolve_method(c)
  refs = references if references is not None else preflight.reference_configs(c)
  return preflight.inert_setting_errors(c, method, refs, control=control) + (
    preflight.optimizer_setting_errors(c, refs)
  )


def test_hybrid_settings_with_no_effect_are_named():
  baseline = hybridjax.default_config()
  assert _errors(baseline) == []
  baseline.hybrid.confidence_threshold = 0.0
  (error,) = _errors(baseline)
  assert error.startswith("--config.hybrid.confidence_threshold=0.0 (default 0.5) has no effect")
  assert "--config.mode=hybrid" in error
  velocity = hybridjax.default_config(mode="hybrid")
  velocity.hybrid.jump.every = 50
  (error,) = _errors(velocity)
  assert "--config.hybrid.jump.every=50" in error and "--config.hybrid.method=jump" in error
  velocity.hybrid.jump.every = 100  # back at its default: nothing to say
  assert _errors(velocity) == []
  jump = hybridjax.default_config(mode="hybrid", method="jump")
  control = registry.load_method("jump").controller_overrides(jump.hybrid, None)
  assert _errors(jump, control) == []
  jump.hybrid.correct_steps = 5
  (error,) = _errors(jump, control)
  assert "--config.hybrid.correct_steps=5 (default 12) has no effect: method 'jump' sets it to 100" in error
  jump.hybrid.correct_steps = 100  # what the method sets anyway
  assert _errors(jump, control) == []
  outer = hybridjax.default_config(mode="hybrid", method="outer_momentum")
  outer.hybrid.enable_predict = True
  assert _errors(outer, {"enable_predict": False}) == []  # the default
  outer.hybrid.enable_predict = False
  assert _errors(outer, {"enable_predict": False}) == []  # the value it sets


def test_every_controller_setting_has_its_config_field():
  """Each setting a method's `control()` may override is a declared `hybrid` field of the same name."""
  names = {f.name for f in dataclasses.fields(ControllerSettings)}
  declared = {f.name.rsplit(".", 1)[-1] for f in config_lib.HYBRID_FIELDS}
  assert names <= declared


@pytest.mark.parametrize(
  "block, fields, meant",
  [
    ("optimizer", {"learning_rate": 0.1}, "optim.learning_rate"),
    ("optimiser", {"name": "sgd", "weight_decay": 0.0}, "optim.name"),
    ("hybrid_settings", {"confidence_threshold": 0.0}, "hybrid.confidence_threshold"),
  ],
)
def test_train_refuses_a_declared_block_set_under_another_name_before_the_workdir_is_made(
  tmp_path, block, fields, meant
):
  # `config.validate` leaves a block of the config's own to its task (its name is not near enough a
  # declared block's to be a misspelling): a block that shares a field with a near declared block is
  # that block, misnamed, and the run would train on its defaults.
  c = rh.mlp_config("hybrid", steps=20)
  c.update({block: fields})
  preflight.validate(c)  # passes: the refusal is the trainer's
  with pytest.raises(
    ValueError, match=rf"--config\.{block}\.\w+ is in a block no one reads: did you mean --config\.{meant}\?"
  ):
    train_lib.train(c, str(tmp_path / "run"), **rh.mlp_task())
  assert not os.path.exists(tmp_path / "run")
  # A block of one's own that shares no field with a near declared block is left alone.
  own = rh.mlp_config("hybrid", steps=20)
  own.update({"optimizer_notes": {"author": "me"}, "sweep": {"learning_rate": 0.1}})
  assert preflight.misnamed_block_errors(own) == []


def test_train_refuses_a_hybrid_setting_the_baseline_ignores_before_the_workdir_is_made(tmp_path):
  c = rh.mlp_config("baseline", steps=20)
  c.hybrid.confidence_threshold = 0.0
  with pytest.raises(ValueError, match=r"--config\.hybrid\.confidence_threshold=0\.0 \(default 0\.5\) has no effect"):
    train_lib.train(c, str(tmp_path / "run"), **rh.mlp_task())
  assert not os.path.exists(tmp_path / "run")


def _user_method_config(path: str):
  c = rh.mlp_config("hybrid", steps=20)
  c.hybrid.velocity = config_lib.default_hybrid_config().velocity  # not read by the user's method
  c.hybrid.method = path
  return config_lib.with_method_block(c)


def test_train_refuses_what_a_user_methods_control_overrides(tmp_path, monkeypatch):
  with method_package(tmp_path, monkeypatch, "ctl_methods", _method_source()) as path:
    c = _user_method_config(path)
    c.hybrid.correction_interval = 0  # what its control() sets: no effect lost
    c.hybrid.max_predict_steps = 3  # its control() sets 1
    with pytest.raises(ValueError, match=r"--config\.hybrid\.max_predict_steps=3 \(default 4\) has no effect"):
      train_lib.train(c, str(tmp_path / "run"), **rh.mlp_task())
    assert not os.path.exists(tmp_path / "run")


def test_no_gpt2_small_preset_is_refused_and_a_change_on_one_is():
  from experiments import gpt2_small
  from experiments.configs import gpt2_small as presets
  from hybridjax.models import gpt2

  combos = [[]] + [[v] for v in presets.VARIANTS] + [list(presets.VARIANTS)]
  arms = [("baseline", "")] + [("hybrid", m) for m in registry.BUILTIN_METHODS]
  for preset, combo, (mode, name) in itertools.product(gpt2.PRESETS, combos, arms):
    c = presets.get_config(",".join([preset, *combo]))
    c.mode, c.hybrid.method = mode, name
    method = registry.load_method(name or config_lib.DEFAULT_METHOD)
    control = method.controller_overrides(c.hybrid, None) if method.controller_overrides else None
    assert _errors(c, control, gpt2_small.preset_configs(c)) == [], (preset, combo, mode, name)
  c = presets.get_config("tiny,micro")
  c.hybrid.confidence_threshold = 0.0  # baseline mode
  with pytest.raises(ValueError, match=r"--config\.hybrid\.confidence_threshold=0\.0 \(default 0\.5\) has no effect"):
    gpt2_small.run(c, "unused")  # refused before the data is read


# --- misspelt method hooks -------------------------------------------------------------------------


def _method_source() -> str:
  with open(os.path.join(ROOT, "docs", "methods.md"), encoding="utf-8") as f:
    text = f.read()
  return re.search(r"<!-- method-example:start -->\s*```python\n(.*?)```", text, re.S).group(1)


def _module(source: str, name: str = "typo_method") -> types.ModuleType:
  module = types.ModuleType(name)
  exec(compile(source, f"{name}.py", "exec"), module.__dict__)
  return module


def test_a_near_miss_of_an_interface_name_is_named_with_did_you_mean():
  source = _method_source()
  assert "def predict_step(" in source and "ADVANCES_SCHEDULE = " in source
  assert registry.misspelt_hook_errors(_module(source), "m") == []  # the example as printed
  typo = source.replace("def predict_step(", "def predict(").replace("ADVANCES_SCHEDULE = ", "ADVANCE_SCHEDULE = ")
  errors = registry.misspelt_hook_errors(_module(typo), "m")
  assert len(errors) == 2
  assert "defines ADVANCE_SCHEDULE" in errors[0] and "did you mean ADVANCES_SCHEDULE?" in errors[0]
  assert "defines predict," in errors[1] and "did you mean predict_step?" in errors[1] and "_predict" in errors[1]
  # The registry alone loads it as the baseline's step: what the check is for.
  record = registry.method_record(_module(typo), "m")
  assert record.predict_step is None and not record.advances_schedule
  # A private helper and an imported function are not the module's interface.
  private = typo.replace("def predict(", "def _predict(").replace("ADVANCE_SCHEDULE = ", "_ADVANCE_SCHEDULE = ")
  assert registry.misspelt_hook_errors(_module(private + "\nfrom os.path import join as metrics\n"), "m") == []


def test_train_refuses_a_method_with_a_misspelt_hook_before_the_workdir_is_made(tmp_path, monkeypatch):
  typo = _method_source().replace("def predict_step(", "def predict(")
  with method_package(tmp_path, monkeypatch, "typo_methods", typo) as path:
    c = _user_method_config(path)
    with pytest.raises(ValueError, match=r"defines predict, .*did you mean predict_step\?"):
      train_lib.train(c, str(tmp_path / "run"), **rh.mlp_task())
    assert not os.path.exists(tmp_path / "run")


# --- optimizer settings the run does not read ------------------------------------------------------

# Each optimizer field's declared `other` value (`schema.Field.other`): away from its default, large
# enough to change an update it enters.
OTHER = {f.name: f.other for f in optim.OPTIMIZER_FIELDS}


def _gpt2_like_params(untied_head: bool) -> dict:
  """A tiny tree with one leaf in each group `optim.muon_group_labels` and `muon_labels` tell apart
  (few leaves: the updates run op by op): token and position embeddings (the position one stays in
  the embed group when the token one is the tied head), a fused qkv matrix, a hidden matrix, a norm
  scale, and an untied head or none (the token embedding tied to the head)."""
  d, vocab = 6, 10
  shapes = {
    "wte": {"embedding": (vocab, d)},
    "wpe": {"embedding": (4, d)},
    "h_0": {"attn": {"c_attn": {"kernel": (d, 3 * d)}, "c_proj": {"kernel": (d, d)}}, "ln_1": {"scale": (d,)}},
  }
  if untied_head:
    shapes["lm_head"] = {"kernel": (d, vocab)}
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
  keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
  return jax.tree.unflatten(treedef, [0.1 * jax.random.normal(k, s) for k, s in zip(keys, leaves)])


def _updates(optim_cfg, params, tx=None, steps: int = 2) -> list:
  """The updates of `steps` optimizer steps at a fixed learning rate, on gradients whose norms grow
  tenfold each step (so clipping, the betas and the momentum all shape them)."""
  tx_given, tx = tx, optim.resolve_optimizer(optim_cfg, params, tx)
  grads = []
  for t in range(steps):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(100 + t), len(leaves))
    grads.append(jax.tree.unflatten(treedef, [10.0**t * jax.random.normal(k, p.shape) for k, p in zip(keys, leaves)]))

  def run(params, grads):
    state, out = tx.init(params), []
    for g in grads:
      updates, state = tx.update(g, optim.with_learning_rate(state, jnp.float32(0.01)), params)
      params = optax.apply_updates(params, updates)
      out.append(updates)
    return out

  # Muon's Newton-Schulz loop runs op by op (compiled, it costs far more than these tiny updates);
  # the other optimizers' steps compile as one program (op by op, their first use in a worker costs
  # seconds of per-op compiles).
  if tx_given is None and optim_cfg.name in MUON_ROWS:
    with jax.disable_jit():
      return run(params, grads)
  return jax.jit(run)(params, grads)


def _changed(optim_cfg, **fields):
  c = ml_collections.ConfigDict(optim_cfg.to_dict())
  c.update(fields)
  return c


def _differs(a, b) -> bool:
  try:
    chex.assert_trees_all_equal(a, b)
  except AssertionError:
    return True
  return False


# The untied head puts a leaf in every group; the tied head's own rows are checked below
# (`test_a_tied_head_reads_its_own_head_fields`), and every field on it, both in the slow set.
# The Muon rows run Newton-Schulz op by op for every field (5-6 s each): the slow set, with the tied
# head's; the default suite keeps the Adam-family and SGD rows.
MUON_ROWS = ("muon", "muon_groups")
# AdamW's row runs the most fields op by op (7 s on 2 cores): the slow set too; Adam's and SGD's stay.
SLOW_ROWS = (*MUON_ROWS, "adamw")


def _reads(name: str, untied_head: bool) -> tuple[list, list]:
  """(the fields optimizer `name` reads on a GPT-2 model with this head, those it declares but this
  head leaves unread), from its declaration."""
  c = ml_collections.ConfigDict({"optim": {"name": name}, "model": {"untied_head": untied_head}})
  fields = optim.OPTIMIZERS[name].fields
  unread = [f for f in fields if f.unread is not None and f.unread(c) and f.name != "muon_momentum_start"]
  return [f for f in fields if f not in unread], unread


@pytest.mark.parametrize(
  "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ROWS else n for n in optim.OPTIMIZERS]
)
@pytest.mark.parametrize("untied_head", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_each_optimizer_reads_what_it_declares(name, untied_head):
  """For each built-in optimizer and head, generated from its declaration (`optimizers.OPTIMIZERS`):
  every field it reads changes its updates; the fields it does not declare, changed all at once,
  leave them bit for bit (or are refused by `make_optimizer`, never silently ignored)."""
  params = _gpt2_like_params(untied_head)
  base = config_lib.default_optim_config()
  base.name = name
  reads, _ = _reads(name, untied_head)
  reference = _updates(base, params)
  for field in reads:
    before, updates = base, reference
    if field.name == "muon_momentum_start":  # read only with a warm-up (its `unread` says so)
      before = _changed(base, muon_momentum_warmup_steps=2)
      updates = _updates(before, params)
    other = field.other
    if (name, field.name) == ("lion", "grad_clip"):  # a sign update sees a clip only where it is not on every step
      other = 0.0
    after = _changed(before, **{field.name: other})
    assert _differs(updates, _updates(after, params)), (name, untied_head, field.name)
  unread = {f.name: f.other for f in optim.OPTIMIZER_FIELDS if f not in optim.OPTIMIZERS[name].fields}
  # make_optimizer's own refusal of the AdamW ratios under another optimizer
  refused = {f for f in optim.ADAMW_LR_RATIOS if f in unread}
  for field in refused:
    with pytest.raises(ValueError, match=field):
      optim.make_optimizer(_changed(base, **{field: unread[field]}))
  ignored = _changed(base, **{f: v for f, v in unread.items() if f not in refused})
  chex.assert_trees_all_equal(_updates(ignored, params), reference)


@pytest.mark.slow  # op by op for every head field (3.4 s on 2 cores)
def test_a_tied_head_leaves_the_fields_its_declaration_says_unread():
  """On a model whose head is tied to the token embedding, the fields an optimizer declares unread on
  it leave the updates bit for bit, and on an untied head the other way round."""
  for untied_head in (False, True):
    params = _gpt2_like_params(untied_head)
    for name in optim.OPTIMIZERS:
      base = config_lib.default_optim_config()
      base.name = name
      _, unread = _reads(name, untied_head)
      if unread:
        chex.assert_trees_all_equal(
          _updates(_changed(base, **{f.name: f.other for f in unread}), params), _updates(base, params)
        )


def test_a_builder_reading_an_undeclared_field_fails_at_once():
  """An optimizer's builder gets a view of only its declared fields: reading another is an error."""
  view = schema.View(config_lib.default_optim_config(), optim.OPTIMIZERS["sgd"].fields, owner="optimizer 'sgd'")
  assert view.grad_clip == 1.0
  with pytest.raises(AttributeError, match="optimizer 'sgd' reads config field 'b1', which it does not declare"):
    _ = view.b1


def test_a_user_optimizer_reads_no_optimizer_field():
  """`train(tx=...)`: every optimizer field changed at once leaves its updates bit for bit."""
  params = _gpt2_like_params(untied_head=False)
  base = config_lib.default_optim_config()
  base.name = "my_adamw"
  for tx in (lambda learning_rate: optax.adamw(learning_rate), optax.inject_hyperparams(optax.adam)(learning_rate=0.0)):
    changed = _changed(base, **OTHER)
    chex.assert_trees_all_equal(_updates(changed, params, tx), _updates(base, params, tx))


def test_the_schedule_reads_what_its_fields_declare():
  """Each schedule's learning rates change with every schedule field its declaration says it reads
  (`optim.RUN_FIELDS`; `decay_fraction` only under 'wsd'), and not with the others."""
  schedule = [f for f in optim.RUN_FIELDS if f.name not in ("name", "schedule") and not f.name.startswith("outer_")]
  for kind in ("cosine", "wsd"):
    base = config_lib.default_optim_config()
    base.schedule = kind
    c = ml_collections.ConfigDict({"optim": base})
    for field in schedule:
      same = np.array_equal(_lrs(base, 100, 100), _lrs(_changed(base, **{field.name: field.other}), 100, 100))
      read = field.unread is None or field.unread(c) is None
      assert same == (not read), (kind, field.name)


def test_outer_momentum_and_averaging_settings_are_read_only_when_on():
  c = hybridjax.default_config()
  c.optim.update(outer_eta=0.5, outer_mu=0.5)
  assert drivers.outer_settings(c.optim) is None  # outer_every=0
  c.optim.outer_every = 4
  assert drivers.outer_settings(c.optim) == (4, 0.5, 0.5)
  c.trainer.averaging_beta = 0.9
  assert drivers.averaging_beta(c.trainer) is None  # averaging='none'
  c.trainer.averaging = "ema"
  assert drivers.averaging_beta(c.trainer) == 0.9


# Each defect a review found, as (fields set, a phrase of the refusal): all trained without a word.
IGNORED_OPTIMIZER_SETTINGS = [
  ({"optim.embed_lr_ratio": 6.0}, "'adamw' reads --config.optim.adamw_embed_lr_ratio instead"),
  ({"optim.name": "muon", "optim.head_lr_ratio": 0.5}, "'muon' reads --config.optim.adam_lr_ratio instead"),
  (
    {"optim.name": "muon_groups", "optim.weight_decay": 0.05},
    "'muon_groups' reads --config.optim.muon_weight_decay instead",
  ),
  ({"optim.name": "muon_groups", "optim.b2": 0.99}, "'muon_groups' reads --config.optim.groups_b2 instead"),
  ({"optim.name": "muon_groups", "optim.adam_lr_ratio": 0.3}, "reads --config.optim.embed_lr_ratio, head_lr_ratio"),
  ({"optim.name": "sgd", "optim.b1": 0.8}, "Only 'adamw', 'adam', 'nadamw', 'schedule_free_adamw' and 'muon' read it"),
  ({"optim.name": "adam", "optim.weight_decay": 0.05}, "Adam: b1, b2, eps, and no weight decay"),
  ({"optim.muon_weight_decay": 0.1}, "'adamw' reads --config.optim.weight_decay instead"),
  ({"optim.decay_fraction": 0.3}, "--config.optim.schedule='cosine' decays from the end of the warm-up"),
  ({"trainer.averaging_beta": 0.9}, "--config.trainer.averaging='none' keeps no average of the params"),
  ({"optim.outer_eta": 0.5}, "--config.optim.outer_every=0 turns outer momentum off"),
  ({"optim.name": "muon", "optim.muon_momentum_start": 0.5}, "--config.optim.muon_momentum_warmup_steps=0 keeps"),
  ({"optim.name": "my_adamw", "optim.grad_clip": 0.5}, "optax.chain(optax.clip_by_global_norm(0.5), ...)"),
]


@pytest.mark.parametrize("fields, phrase", IGNORED_OPTIMIZER_SETTINGS)
def test_optimizer_settings_with_no_effect_are_named(fields, phrase):
  c = hybridjax.default_config()
  assert preflight.optimizer_setting_errors(c, preflight.reference_configs(c)) == []
  c.update_from_flattened_dict(fields)
  (error,) = preflight.optimizer_setting_errors(c, preflight.reference_configs(c))
  field, value = [(f, v) for f, v in fields.items() if f != "optim.name"][0]
  default = config_lib.flatten(hybridjax.default_config())[field]
  assert error.startswith(f"--config.{field}={value!r} (default {default!r}) has no effect: "), error
  assert phrase in error, error
  # Back at a value the run reads (or the default): nothing to say.
  if field == "optim.decay_fraction":
    c.optim.schedule = "wsd"
  elif field == "trainer.averaging_beta":
    c.trainer.averaging = "ema"
  elif field in ("optim.outer_eta",):
    c.optim.outer_every = 4
  elif field == "optim.muon_momentum_start":
    c.optim.muon_momentum_warmup_steps = 10
  else:
    c.update_from_flattened_dict({field: default})
  assert preflight.optimizer_setting_errors(c, preflight.reference_configs(c)) == []


def test_a_user_optimizer_gets_the_fields_it_does_not_read_named_at_once():
  c = hybridjax.default_config()
  c.optim.update(name="my_adamw", grad_clip=0.5, b1=0.8, weight_decay=0.0, learning_rate=1e-2, schedule="wsd")
  (error,) = preflight.optimizer_setting_errors(c, preflight.reference_configs(c))
  assert error.startswith(
    "--config.optim.grad_clip=0.5 (default 1.0), --config.optim.b1=0.8 (default 0.9), --config.optim.weight_decay=0.0 "
    "(default 0.1) have no effect: --config.optim.name='my_adamw' names your own optimizer (train(tx=...))"
  )
  assert "optax.adamw(learning_rate, weight_decay=0.0)" in error  # the schedule's fields are not named


def test_head_fields_follow_the_models_head():
  """On GPT-2: a tied head reads the tied-head fields, not the head's; an untied one the other way."""
  from experiments.configs import gpt2_small as presets

  tied = presets.get_config("tiny")
  tied.optim.update(name="muon_groups", head_lr_ratio=0.5)
  (error,) = preflight.optimizer_setting_errors(tied, preflight.reference_configs(tied))
  assert "--config.optim.head_lr_ratio=0.5 (default 0.16) has no effect: --config.model.untied_head=False" in error
  tied.optim.update(head_lr_ratio=0.16, tied_lr_ratio=0.5)
  assert preflight.optimizer_setting_errors(tied, preflight.reference_configs(tied)) == []
  tied.optim.update(name="adamw", tied_lr_ratio=0.16, adamw_head_lr_ratio=2.0)
  (error,) = preflight.optimizer_setting_errors(tied, preflight.reference_configs(tied))
  assert "--config.optim.adamw_head_lr_ratio=2.0 (default 1.0) has no effect: --config.model.untied_head=False" in error
  assert "Set --config.optim.adamw_embed_lr_ratio instead" in error
  untied = presets.get_config("tiny")
  untied.model.untied_head = True
  untied.optim.update(name="muon_groups", tied_b1=0.5)
  (error,) = preflight.optimizer_setting_errors(untied, preflight.reference_configs(untied))
  assert "--config.optim.tied_b1=0.5 (default 0.8) has no effect: --config.model.untied_head=True" in error


def test_a_preset_value_is_not_refused_and_a_change_on_it_is():
  """`tiny,speedrun` sets weight_decay=0 for 'muon_groups' (and tied-head settings on its untied head):
  its own values; an explicit weight decay on it is refused before the data is read."""
  from experiments import gpt2_small
  from experiments.configs import gpt2_small as presets

  c = presets.get_config("tiny,speedrun")
  assert c.optim.name == "muon_groups" and c.optim.weight_decay == 0.0 and c.model.untied_head
  assert c.preset == "tiny,speedrun"  # the variants recorded: the reference is the preset as given
  assert preflight.optimizer_setting_errors(c, gpt2_small.preset_configs(c)) == []
  c.optim.weight_decay = 0.05
  with pytest.raises(ValueError, match=r"--config\.optim\.weight_decay=0\.05 \(default 0\.0\) has no effect"):
    gpt2_small.run(c, "unused")
  # The base preset's value (0.1) is no value of this preset's: refused too, where it once trained
  # without a word (the check compared with the base preset).
  c.optim.weight_decay = 0.1
  with pytest.raises(ValueError, match=r"--config\.optim\.weight_decay=0\.1 \(default 0\.0\) has no effect"):
    gpt2_small.run(c, "unused")


def test_a_command_line_field_the_run_does_not_read_is_refused_whatever_its_value(tmp_path):
  """`--config.optim.weight_decay=0.0` under `tiny,speedrun`: the preset's own value, but given on the
  command line for an optimizer that reads none, so refused; the same value from Python is not."""
  from experiments import gpt2_small
  from experiments.configs import gpt2_small as presets

  c = presets.get_config("tiny,speedrun")
  with pytest.raises(ValueError, match=r"--config\.optim\.weight_decay=0\.0 \(default 0\.0\) has no effect"):
    gpt2_small.run(c, str(tmp_path / "run"), given=["optim.weight_decay", "trainer.steps"])
  assert not os.path.exists(tmp_path / "run")


def test_train_refuses_what_a_user_optimizer_does_not_read_before_the_workdir_is_made(tmp_path):
  c = rh.mlp_config("baseline", steps=20)
  c.optim.update(name="my_sgd", weight_decay=0.05)
  with pytest.raises(ValueError, match=r"--config\.optim\.weight_decay=0\.05 \(default 0\.1\) has no effect"):
    train_lib.train(c, str(tmp_path / "run"), tx=lambda learning_rate: optax.sgd(learning_rate), **rh.mlp_task())
  assert not os.path.exists(tmp_path / "run")
