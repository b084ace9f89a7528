"""The speedrun recipe's steps (`hybridjax.bench.speedrun.TRICKS`): each changes what its record changed
and only that, every step is a valid run at every CPU preset, the `deep` preset's later steps connect
distinct layers, and a field the command line set wins over a trick, with the record saying so."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

from experiments.configs import benchmark as benchmark_cfg
from hybridjax import cli
from hybridjax import config as config_lib
from hybridjax.bench import speedrun, study
from hybridjax.bench.studies.recipe import report as recipe_report
from hybridjax.bench.studies.recipe import run as recipe_run
from hybridjax.models import gpt2


def _steps(config):
  """{step: the config with every trick up to it applied}."""
  names = speedrun.tricks_of(config)
  return {name: speedrun.apply_tricks(config, names[: k + 1]) for k, name in enumerate(names)}


def _changed(before, after):
  a, b = config_lib.flatten(before), config_lib.flatten(after)
  return {k: b[k] for k in b if a.get(k) != b[k]}


def test_each_step_changes_what_its_record_changed():
  c = benchmark_cfg.get_config("long")
  assert list(speedrun.TRICKS) == [
    "schedule",
    "rotary",
    "muon",
    "modern_arch",
    "untied_head",
    "shortcuts",
    "unet",
    "value_embeds",
    "attn_scale",
  ]
  assert speedrun.tricks_of(c) == list(speedrun.TRICKS)
  steps = _steps(c)
  before, changed = c, {}
  for name, after in steps.items():
    changed[name] = _changed(before, after)
    before = after
  # #3-#4: no LR warm-up, the tied embedding-head matrix at AdamW 0.36 / (0.9, 0.95) / 1e-8, PyTorch's init.
  assert changed["muon"] == {
    "optim.name": "muon_groups",
    "optim.grad_clip": 0.0,
    "optim.weight_decay": 0.0,
    "optim.warmup_steps": 0,
    "optim.tied_lr_ratio": 0.36,
    "optim.tied_b1": 0.9,
    "optim.tied_eps": 1e-8,
    "model.init": "fan_in",
  }
  # #5 without the embedding norm, which came with #8's untied head.
  assert changed["modern_arch"] == {"model.relu2": True, "model.qk_norm": True, "model.zero_init_proj": True}
  assert changed["untied_head"] == {"model.untied_head": True, "model.embed_norm": True}
  # #9: the value residual and Muon's momentum warm-up over the record's 500 of 3200 steps' share of N.
  assert changed["shortcuts"] == {
    "model.embed_skips": True,
    "model.logit_softcap": 15.0,
    "model.value_residual": True,
    "optim.muon_momentum_warmup_steps": round(3000 * 500 / 3200),
  }
  # #14: value embeddings replaced the value residual.
  assert changed["value_embeds"] == {"model.value_embeds": 1, "model.value_residual": False}
  # #20: the record's bound on the QK-normed scores, 0.12 * 128, at long's head_dim 16; its init.
  assert changed["attn_scale"] == {"model.attn_scale": pytest.approx(0.12 * 128 / 16), "model.init": "fan_in_0.5"}
  for name, trick in speedrun.TRICKS.items():
    assert trick.record.startswith("#"), name


@pytest.mark.parametrize("preset", ["tiny", "long", "deep"])
def test_every_step_is_a_valid_run_at_every_cpu_preset(preset):
  c = benchmark_cfg.get_config(preset)
  c.benchmark.study = "recipe"
  study.validate(c)
  last = _steps(c)["attn_scale"]
  head_dim = last.model.d_model // last.model.n_head
  assert last.model.attn_scale * head_dim == pytest.approx(15.36)  # the record's bound at every head_dim
  assert 0 < last.optim.muon_momentum_warmup_steps < last.trainer.steps


def test_the_deep_preset_connects_distinct_layers():
  """At `deep` (6 layers, head_dim 32) the U-net pairs distinct layers, the value-embedding table
  reaches the first and the last layer only, and the value residual reaches every later layer."""
  c = benchmark_cfg.get_config("deep")
  m = c.model
  assert m.n_layer >= 6 and m.n_layer % 2 == 0 and m.d_model // m.n_head >= 32
  steps = _steps(c)
  full = gpt2.GPT2Config(**steps["value_embeds"].model.to_dict())
  assert [gpt2.value_embed_layer(full, i) for i in range(6)] == [0, None, None, None, None, 0]
  # U-net: layer i's output (pushed) goes into layer n - 1 - i's input (popped): 2-3, 1-4, 0-5.
  half = full.n_layer // 2
  assert [(i, full.n_layer - 1 - i) for i in reversed(range(half))] == [(2, 3), (1, 4), (0, 5)]
  shortcuts = gpt2.GPT2Config(**steps["shortcuts"].model.to_dict())
  tokens = jnp.zeros((1, 8), jnp.int32)
  params = jax.eval_shape(lambda: gpt2.GPT2(shortcuts).init(jax.random.PRNGKey(0), tokens)["params"])
  mixed = [i for i in range(6) if "value_residual_lambda" in params[f"h_{i}"]["attn"]]
  assert mixed == [1, 2, 3, 4, 5]
  long = gpt2.GPT2Config(**_steps(benchmark_cfg.get_config("long"))["value_embeds"].model.to_dict())
  assert [gpt2.value_embed_layer(long, i) for i in range(2)] == [0, 0]  # at 2 layers: one table, both layers


def test_a_field_the_command_line_set_wins_over_a_trick_and_the_record_says_so():
  """`--config.model.relu2=False` with the recipe: every step from #5 on trains without ReLU², and
  the record names the field, the trick's value and the one kept. Fields of the benchmark block are
  not kept (no trick sets them)."""
  argv = ["prog", "--config.model.relu2=False", "--config.benchmark.study=recipe", "--config.optim.warmup_steps", "20"]
  fields = cli.command_line_fields(argv)
  assert fields == ["model.relu2", "benchmark.study", "optim.warmup_steps"]
  c = benchmark_cfg.get_config("long")
  c.model.relu2 = False
  c.optim.warmup_steps = 20
  c = speedrun.keep_command_line(c, fields)
  assert c.benchmark.recipe.keep == "model.relu2,optim.warmup_steps"
  steps = recipe_run.step_configs(c, 6e-3)
  assert not any(s.model.relu2 for s in steps.values())
  assert steps["modern_arch"].model.qk_norm and all(s.optim.warmup_steps == 20 for s in steps.values())
  kept = speedrun.kept_changes(c)
  assert kept == {"muon": {"optim.warmup_steps": [0, 20]}, "modern_arch": {"model.relu2": [True, False]}}
  assert not speedrun.speedrun_config(c).model.relu2  # R6 keeps it too
  text = " ".join(recipe_report.kept_lines({"kept": kept}))
  assert "`modern_arch`: model.relu2=False (the trick's True)" in text
  assert recipe_report.kept_lines({}) == []
  # A kept field that is no field of the config is refused, naming it.
  c.benchmark.update(study="recipe")
  c.benchmark.recipe.keep = "model.relu3"
  with pytest.raises(ValueError, match=r"--config\.benchmark\.recipe\.keep='model\.relu3' names \['model\.relu3'\]"):
    study.validate(c)


def test_the_first_trick_list_is_kept_to_read_the_published_recipes():
  """`TRICKS_V1` is what the published recipes measured: the embedding norm in the #5 group, no
  warm-up change, the tied head at the untied head's settings, and no step after the value embeddings."""
  assert list(speedrun.TRICKS_V1) == [
    "schedule",
    "rotary",
    "muon",
    "modern_arch",
    "untied_head",
    "embed_skips",
    "unet",
    "value_embeds",
  ]
  c = benchmark_cfg.get_config("long")
  assert speedrun.TRICKS_V1["modern_arch"].changes(c)["model.embed_norm"] is True
  assert set(speedrun.TRICKS_V1["muon"].changes(c)) == {"optim.name", "optim.grad_clip", "optim.weight_decay"}
  assert speedrun.trick_list({}) is speedrun.TRICKS_V1
  assert speedrun.trick_list({"trick_list": speedrun.TRICK_LIST_VERSION}) is speedrun.TRICKS


def test_a_recipe_of_an_earlier_trick_list_says_so_in_its_report():
  path = pathlib.Path(__file__).parents[3] / "docs" / "results" / "recipe" / "trick-list-1-recipe-long.json"
  published = json.loads(path.read_text())
  assert "trick_list" not in published  # measured with the first list
  assert "Measured with trick list 1, before the fixes of list 2" in recipe_report.recipe_markdown(published)
  today = published | {"trick_list": speedrun.TRICK_LIST_VERSION}
  assert recipe_report.trick_list_lines(today) == [] and "before the fixes" not in recipe_report.recipe_markdown(today)
