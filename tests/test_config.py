"""Config blocks and their validation (hybridjax.config); the experiment presets."""

from __future__ import annotations

import pytest
from conftest import micro_config

from hybridjax import config as config_lib


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
    config_lib.validate(c)


def test_presets_are_valid_and_micro_shrinks_tiny():
  from experiments.configs import gpt2_small

  for preset in ("tiny", "small", "124m", "tiny,micro"):
    config_lib.validate(gpt2_small.get_config(preset))
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
