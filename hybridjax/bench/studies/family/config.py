"""The family protocol's fields are the benchmark block's own (`specs.validate_benchmark` checks them);
its check of the publish folder (`check_publish`), of the optimizer fields no run of it reads
(`unread_optimizer_field_errors`) and of the speedrun family's config against its recipe
(`speedrun_family_errors`)."""

from __future__ import annotations

import os

from hybridjax import config as config_lib
from hybridjax import preflight
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import record, speedrun
from hybridjax.bench.studies import Config, Record, copied

PUBLISHED = ("benchmark.json", "headline.json", "results.md")  # a family's published record, beside its plots


def trained_arms(config: Config) -> tuple[list[str], str]:
  """The arms the family trains (`arms.selected`), and the field that names them."""
  return arms_lib.selected(config), "--config.benchmark.methods"


def check_publish(config: Config | Record, folder: str) -> None:
  """Refuses (ValueError naming --config.benchmark.publish) to publish a family of `config` into
  `folder` where it holds another family's results: a benchmark.json of another config (another
  preset, family, task or setting, `record.config_differences`), or results with
  no benchmark.json to compare with. A benchmark.json of the same config is a re-run: it is replaced."""
  if not folder:
    return
  held = [name for name in PUBLISHED if os.path.exists(os.path.join(folder, name))]
  if held and "benchmark.json" not in held:
    path = os.path.join(folder, held[0])
    raise ValueError(record.publish_refusal(folder, path, "with no benchmark.json to compare this config with"))
  record.check_publish(config, folder, "benchmark.json", record.other_studies("family"))


def validate(config: Config) -> dict[str, Config]:
  """The publish folder (`check_publish`); a family trains only `config`."""
  check_publish(config, str(config.benchmark.publish))
  return {}


def unused_field_errors(config: Config, fields: list[str]) -> list[str]:
  """The skeleton's hook (`study.unused_field_errors`): `unread_optimizer_field_errors` and
  `speedrun_family_errors`."""
  return unread_optimizer_field_errors(config, fields) + speedrun_family_errors(config)


def speedrun_family_errors(config: Config) -> list[str]:
  """The speedrun family's config against its own recipe: `speedrun.speedrun_config` applied the
  tricks when the config was built; a field a trick derives from that changed after (from Python:
  `c.trainer.steps = 3000` after `get_config('long,speedrun')`), or `benchmark.recipe.tricks`,
  `muon_lr` set after, would leave a value no trick gives this config (the command line's overrides
  are applied before the tricks: `after_command_line` in experiments/configs/benchmark.py)."""
  if not speedrun.is_speedrun_family(config):
    return []
  kept = set(speedrun.kept_fields(config))
  expected = speedrun.apply_tricks(config, speedrun.tricks_of(config))
  if speedrun.uses_muon(expected) and "optim.learning_rate" not in kept:
    expected.optim.learning_rate = float(config.benchmark.recipe.muon_lr)
  flat, want = config_lib.flatten(config), config_lib.flatten(expected)
  stale = [k for k, v in want.items() if not k.startswith("benchmark.") and flat.get(k) != v]
  if not stale:
    return []
  return [
    "the speedrun family's config is not its recipe's ("
    + ", ".join(f"--config.{k}={flat.get(k)!r} where benchmark.recipe gives {want[k]!r}" for k in stale)
    + "): the tricks were applied before a field they derive from, or benchmark.recipe.tricks/muon_lr, changed. "
    f"Set the fields on the preset without the family (get_config({str(config.benchmark.preset)!r})) and apply "
    "hybridjax.bench.speedrun.speedrun_config to it, or keep a value as given with --config.benchmark.recipe.keep"
  ]


def unread_optimizer_field_errors(config: Config, fields: list[str]) -> list[str]:
  """A line for each `optim` field the command line set (`fields`, dotted) that no run of the family
  reads, as `train()` refuses it (`preflight.optimizer_setting_errors`): the anchors' runs
  and every selected arm's (an arm may turn outer momentum on, where `optim.outer_eta` is read). A
  user's task with its own optimizer reads no built-in optimizer field; a cosine schedule reads no
  `optim.decay_fraction`. The other studies train configs of their own (the recipe's tricks change the
  optimizer), which they check themselves."""
  given = sorted({f for f in fields if f.split(".")[0] == "optim"})
  if not given:
    return []
  try:
    defined = arms_lib.arms(config)
    configs = [arms_lib.base_config(config)] + [
      arms_lib.run_config(config, defined[n]) for n in arms_lib.selected(config)
    ]
  except (KeyError, ValueError):
    return []  # an arm that is not defined: `specs.validate_benchmark` names it
  defaults, flat = preflight.field_defaults(), config_lib.flatten(config)
  errors = []
  for field in given:
    if field not in defaults or flat.get(field) == defaults[field]:
      continue  # a field of no built-in block (the config checks name it), or left at its default
    found = []
    for c in configs:
      if field not in config_lib.flatten(c):
        break  # a field this run's config does not hold: the config checks name it
      lines = preflight.optimizer_setting_errors(c, [copied(c, {field: defaults[field]})])  # only it counts as set
      if not lines:
        break
      found.append(lines[0])
    else:
      errors.append(f"{found[0]} (no run of this benchmark reads it: the anchors' nor any arm's)")
  return errors
