"""Config blocks and their validation (hybridjax.config); the experiment presets."""

from __future__ import annotations

import ml_collections
import pytest
from conftest import micro_config

from hybridjax import config as config_lib
from hybridjax import preflight


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("trainer.steps", -5, "trainer.steps"),
    ("trainer.grad_accum", 3, "trainer.batch_size"),
    ("optim.learning_rate", 0.0, "optim.learning_rate"),
    ("model.n_head", 5, "model.d_model"),
    ("data.tokenizer", "wordpiece", "data.tokenizer"),
    ("hybrid.max_predict_steps", 0, "hybrid.max_predict_steps"),
    ("hybrid.confidence_threshold", 1.5, "hybrid.confidence_threshold"),
    ("hybrid.dispatch", "fused", "hybrid.dispatch"),
    ("hybrid.steps_per_call", 0, "hybrid.steps_per_call"),
    ("hybrid.velocity.corrector.enabled", 1, "hybrid.velocity.corrector.enabled"),
    ("mode", "fast", "mode"),
  ],
)
def test_config_errors_name_the_field(field, value, match):
  c = micro_config()
  node = c
  *parents, leaf = field.split(".")
  for p in parents:
    node = node[p]
  with c.unlocked():
    if type(node[leaf]) is not type(value):
      del node[leaf]
    node[leaf] = value
  with pytest.raises(ValueError, match=match):
    preflight.validate(c)


def test_presets_are_valid_and_micro_shrinks_tiny():
  from experiments.configs import gpt2_small

  for preset in ("tiny", "small", "124m", "tiny,micro"):
    preflight.validate(gpt2_small.get_config(preset))
  micro, tiny = gpt2_small.get_config("tiny,micro"), gpt2_small.get_config("tiny")
  assert (micro.model.n_layer, micro.model.d_model, micro.trainer.batch_size) == (1, 32, 4)
  assert micro.hybrid.velocity.rssm.ensemble == 2 and tiny.hybrid.velocity.rssm.ensemble == 3
  assert micro.hybrid.dispatch == tiny.hybrid.dispatch == "switch"
  assert micro.hybrid.velocity.corrector.enabled
  with pytest.raises(ValueError, match="unknown preset variant"):
    gpt2_small.get_config("tiny,huge")
  with pytest.raises(ValueError, match="unknown preset"):
    gpt2_small.get_config("giant")


def test_flatten_is_the_inverse_of_update_from_flattened_dict():
  c = micro_config("hybrid")
  flat = config_lib.flatten(c)
  assert flat["trainer.steps"] == 20 and flat["hybrid.velocity.rssm.ensemble"] == 2
  assert flat["hybrid.velocity.corrector.enabled"] is True
  assert not any(isinstance(v, dict) or hasattr(v, "items") for v in flat.values())
  other = micro_config("baseline", steps=99)
  other.update_from_flattened_dict(flat)
  assert config_lib.flatten(other) == flat
  assert config_lib.flatten({"a": {"b": 1}, "c": 2}) == {"a.b": 1, "c": 2}


# --- no silent wrong result: misspelt keys, a method without hybrid mode, older checkpoints ----------


def _misspelt(c):
  c.trainer.stepz = 50


@pytest.mark.parametrize(
  "mistake,field,nearest",
  [
    (_misspelt, "trainer.stepz", "trainer.steps"),
    (lambda c: c.trainer.update(stepz=50), "trainer.stepz", "trainer.steps"),
    (lambda c: setattr(c.hybrid, "warmup_step", 10), "hybrid.warmup_step", "hybrid.warmup_steps"),
    (lambda c: setattr(c.hybrid.velocity, "betaa", 0.5), "hybrid.velocity.betaa", "hybrid.velocity.beta"),
    (lambda c: setattr(c, "sed", 3), "sed", "seed"),
    (lambda c: setattr(c, "trainr", {"steps": 3}), "trainr.steps", "trainer.steps"),
  ],
)
def test_a_misspelt_key_set_from_python_is_refused_naming_the_nearest_field(mistake, field, nearest):
  """`default_config()` is locked: the misspelling fails at the assignment, with ml_collections' "did
  you mean"; an unlocked copy (a config of the user's own) is refused by the pre-flight, naming the
  nearest field."""
  c = config_lib.default_config("hybrid")
  leaf, near = field.split(".")[-1] if "." in field and field != "trainr.steps" else field.split(".")[0], None
  near = nearest.split(".")[-1] if field != "trainr.steps" else "trainer"
  with pytest.raises((AttributeError, KeyError), match=rf'Did you mean "{near}" instead of "{leaf}"\?'):
    mistake(c)
  unlocked = ml_collections.ConfigDict(c.to_dict())
  mistake(unlocked)
  message = rf"--config\.{field} is not a field of the config: did you mean --config\.{nearest}\?"
  with pytest.raises(ValueError, match=message):
    preflight.validate(unlocked)


def test_every_preset_field_is_declared_and_a_task_block_is_its_own():
  """Nothing a preset or `default_config` holds is refused; a block of the config's own (a task's)
  is left to the task."""
  for arg in ("tiny", "small", "124m", "tiny,micro"):
    assert preflight.unknown_field_errors(micro_config() if arg == "tiny,micro" else _preset(arg)) == []
  c = config_lib.default_config()
  with c.unlocked():  # a task's block, added by its owner
    c.mlp = {"features": (32, 32)}
  preflight.validate(c)


def _preset(arg):
  from experiments.configs import gpt2_small

  return gpt2_small.get_config(arg)


def test_a_method_named_in_baseline_mode_is_refused_and_none_means_velocity():
  c = config_lib.default_config()
  assert c.hybrid.method == "" and config_lib.method_name(c) == "velocity"
  c.hybrid.method = "jump"
  with pytest.raises(ValueError, match=r"--config\.hybrid\.method='jump' is set but --config\.mode='baseline'"):
    preflight.validate(c)
  with pytest.raises(ValueError, match=r"pass mode='hybrid'"):
    config_lib.default_config("baseline", method="jump")
  c = config_lib.default_config("hybrid")
  preflight.validate(c)
  assert config_lib.resolve_method(c).name == "velocity"


def test_a_method_block_comes_with_default_config_and_its_fields_are_checked(tmp_path, monkeypatch):
  """`default_config('hybrid', method=...)` adds the method's block, so its fields can be set at
  once; a misspelt one, or one of the wrong type, is refused naming it."""
  pkg = tmp_path / "user_cfg_methods"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "counted.py").write_text(
    "from hybridjax import fields\n"
    "NAME = 'counted'\nCONFIG_KEY = 'counted'\n"
    "CONFIG = {'every': (10, fields.check_int(1))}\n"
    "def make_settings(hybrid, *, groups):\n  return int(hybrid.counted.every)\n"
    "def init(ctx, params, rng):\n  return None\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  c = config_lib.default_config("hybrid", method="user_cfg_methods.counted")
  c.hybrid.counted.every = 3
  preflight.validate(c)
  with pytest.raises(AttributeError, match=r'Did you mean "every" instead of "everyy"\?'):
    c.hybrid.counted.everyy = 3  # the block came in locked with the config
  c = ml_collections.ConfigDict(c.to_dict())  # an unlocked copy: the pre-flight names it
  c.hybrid.counted.everyy = 3
  message = r"--config\.hybrid\.counted\.everyy is not a field.*--config\.hybrid\.counted\.every\?"
  with pytest.raises(ValueError, match=message):
    preflight.validate(c)
  c = ml_collections.ConfigDict(config_lib.default_config("hybrid").to_dict())
  c.hybrid.method = "user_cfg_methods.counted"
  c.hybrid.counted = {"every": "often"}
  message = r"--config\.hybrid\.counted\.every='often': method 'counted' declares it as int"
  with pytest.raises(ValueError, match=message):
    config_lib.with_method_block(c)


def test_an_older_checkpoints_config_compares_equal_where_it_means_the_same():
  """A field missing from a saved config compares as its default; a saved hybrid.method='velocity'
  (the old default) equals the new '' in hybrid mode, and any method equals '' in baseline mode."""
  import json

  from hybridjax import checkpoint as ckpt_lib

  for mode in ("baseline", "hybrid"):
    current = config_lib.default_config(mode)
    saved = json.loads(current.to_json())
    saved["hybrid"]["method"] = "velocity"
    del saved["trainer"]["averaging_beta"]  # a field a newer version added
    assert ckpt_lib.config_differences(saved, current) == []
    saved["trainer"]["averaging_beta"] = 0.5  # a real difference still shows
    expected = ["trainer.averaging_beta: checkpoint has 0.5, config has 0.99"]
    assert ckpt_lib.config_differences(saved, current) == expected
  current = config_lib.default_config("hybrid")
  saved = json.loads(current.to_json())
  saved["hybrid"]["method"] = "jump"
  assert ckpt_lib.config_differences(saved, current) == ["hybrid.method: checkpoint has 'jump', config has 'velocity'"]


def test_a_checkpoint_and_a_record_read_one_config_identity():
  """The resume's comparison and the published records' read the same normalisation
  (`identity.comparable`): a config with the earlier spellings (`hybrid.predictor`, the default
  method's fields flat in the hybrid block) is the same run to both; a baseline run reads no hybrid
  field, a hybrid run no other method's block."""
  import json

  from hybridjax import checkpoint as ckpt_lib
  from hybridjax.bench import record

  current = config_lib.default_config("hybrid")
  saved = json.loads(current.to_json())
  h = saved["hybrid"]
  h["predictor"] = h.pop("method")
  h["velocity_beta"], h["window"] = h["velocity"]["beta"], h["velocity"].pop("window")
  del h["velocity"]["beta"]
  h["jump"]["every"] = 7  # another method's block: not read by a velocity run
  assert ckpt_lib.config_differences(saved, current) == [] == record.config_differences(saved, current)
  # A config of no one run's mode (a benchmark's, whose arms run every method) compares every block.
  later = json.loads(current.to_json()) | {"mode": "benchmark"}
  assert record.config_differences(saved | {"mode": "benchmark"}, later) == ["hybrid.jump.every: 7 there, 100 here"]
  h["velocity_beta"] = 0.5
  assert ckpt_lib.config_differences(saved, current) == ["hybrid.velocity.beta: checkpoint has 0.5, config has 0.99"]
  saved["mode"], current = "baseline", config_lib.default_config("baseline")
  assert ckpt_lib.config_differences(saved, current) == []


def test_the_speedrun_presets_apply_every_trick_as_the_benchmark_does(monkeypatch):
  """`tiny,speedrun` is the recipe as the benchmark applies it, at its published LR; `124m,speedrun`
  has no published table: the record's LRs, and its notes say they are untuned; a published table of
  an earlier trick list says its LR was tuned before today's tricks."""
  import dataclasses

  from hybridjax.bench import speedrun

  for arg in ("tiny", "124m"):
    c = _preset(f"{arg},speedrun")
    preflight.validate(c)
    expected = config_lib.flatten(speedrun.apply_tricks(_preset(arg), list(speedrun.TRICKS)))
    own = {"optim.learning_rate", "trainer.averaging", "trainer.averaging_beta", "notes", "preset"}  # the preset's
    got = config_lib.flatten(c)
    assert {k: v for k, v in got.items() if k not in own} == {k: v for k, v in expected.items() if k not in own}
    assert any(got[k] != v for k, v in config_lib.flatten(_preset(arg)).items())  # the tricks changed it
  assert "docs/results/recipe/recipe-tiny.json tuned" in _preset("tiny,speedrun").notes
  big = _preset("124m,speedrun")
  assert "untuned at 124m" in big.notes and big.optim.learning_rate == 0.05
  import json
  import os

  from experiments.configs import gpt2_small

  with open(os.path.join(gpt2_small._RECIPE_RESULTS, "recipe-tiny.json")) as f:
    published = json.load(f)["records"]
  same = {name: speedrun.Trick(name, record, lambda c: {}) for name, record in published.items()}
  monkeypatch.setattr(speedrun, "TRICKS", same)  # a definition equal to the published one: no caveat
  assert "earlier definition" not in _preset("tiny,speedrun").notes
  changed = dict(same)
  changed["muon"] = dataclasses.replace(changed["muon"], record="#3 something else")
  monkeypatch.setattr(speedrun, "TRICKS", changed)
  assert "tuned before today's tricks" in _preset("tiny,speedrun").notes


def test_a_dropout_the_gpt2_task_never_applies_is_refused_before_the_workdir(tmp_path):
  """The GPT-2 task's batches carry no dropout key, so `model.dropout` > 0 trained deterministically
  (bit for bit the run at 0) while the record said otherwise: refused by the CLI's run and the
  benchmark alike."""
  from experiments import gpt2_small
  from experiments.configs import benchmark as benchmark_cfg
  from hybridjax.bench import specs

  c = _preset("tiny,micro")
  c.model.dropout = 0.5
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"--config\.model\.dropout=0\.5 is set but not applied"):
    gpt2_small.run(c, str(workdir))
  assert not workdir.exists()
  b = benchmark_cfg.get_config("quick")
  specs.validate_benchmark(b)
  b.model.dropout = 0.1
  with pytest.raises(ValueError, match=r"--config\.model\.dropout=0\.1 is set but not applied"):
    specs.validate_benchmark(b)


def test_a_speedrun_value_derived_before_a_python_change_is_refused_before_the_workdir(tmp_path):
  """From Python, `get_config('tiny,speedrun')` then a new length and width kept the momentum warm-up
  and the attention scale the preset derived; the command line derives them again."""
  from experiments import gpt2_small
  from experiments.configs import gpt2_small as presets

  c = _preset("tiny,speedrun")
  c.trainer.steps, c.model.d_model, c.model.n_head = 100, 32, 2
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    gpt2_small.run(c, str(workdir))
  for field in ("--config.model.attn_scale=", "--config.optim.muon_momentum_warmup_steps="):
    assert field in str(e.value)
  assert "after_command_line" in str(e.value) and not workdir.exists()
  # As the command line builds it: every derived value follows, nothing stale.
  fixed = presets.after_command_line(c, "tiny,speedrun", ["trainer.steps", "model.d_model", "model.n_head"])
  assert presets.stale_derived_fields(fixed) == {}
  assert fixed.optim.muon_momentum_warmup_steps != c.optim.muon_momentum_warmup_steps
  # A value chosen for a trick's field, its inputs unchanged, is the caller's; a plain preset has none.
  chosen = _preset("tiny,speedrun")
  chosen.model.attn_scale, chosen.model.relu2 = 0.3, False
  assert presets.stale_derived_fields(chosen) == {}
  plain = _preset("tiny")
  plain.trainer.steps = 100
  assert presets.stale_derived_fields(plain) == {}


def test_the_recipe_on_a_one_layer_model_is_refused_naming_the_recipe(tmp_path):
  """`tiny,micro,speedrun`: validation alone blamed model.unet_skips and model.value_embeds, which the
  user never set; the refusal names the recipe's tricks and both ways out, before the workdir."""
  from experiments import gpt2_small

  workdir = tmp_path / "run"
  message = (
    r"the speedrun recipe's U-net skips \(#11\) .* even n_layer; its value embeddings \(#14-#17, "
    r"model\.value_embeds=1\) .* n_layer >= 2: model\.n_layer is 1 .* without them: "
    r"--config\.model\.unet_skips=False --config\.model\.value_embeds=0$"
  )
  with pytest.raises(ValueError, match=message):
    gpt2_small.run(_preset("tiny,micro,speedrun"), str(workdir))
  assert not workdir.exists()
  # Three layers: the value embeddings have their distinct layers; only the U-net is blamed.
  from experiments.configs import gpt2_small as presets

  three = _preset("tiny,speedrun")
  three.model.n_layer = 3  # as --config.model.n_layer=3 sets it: the tricks derived again
  three = presets.after_command_line(three, "tiny,speedrun", ["model.n_layer"])
  with pytest.raises(ValueError) as e:
    gpt2_small.check_speedrun_depth(three)
  assert "value embeddings" not in str(e.value), str(e.value)
  assert str(e.value).endswith("without it: --config.model.unet_skips=False"), str(e.value)
  without = _preset("tiny,micro,speedrun")
  without.model.update(unet_skips=False, value_embeds=0)
  gpt2_small.check_speedrun_depth(without)  # the recipe without them is the user's to train
  gpt2_small.check_speedrun_depth(_preset("tiny,speedrun"))  # two layers pair
