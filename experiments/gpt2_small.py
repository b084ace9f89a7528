"""Train GPT-2 on the bundled Shakespeare corpus (or any text), baseline or hybrid: the program that
runs the library's GPT-2 task (`hybridjax.tasks.gpt2`, re-exported here).

python -m experiments.gpt2_small                                   # tiny preset, CPU, minutes
python -m experiments.gpt2_small --config=experiments/configs/gpt2_small.py:small
python -m experiments.gpt2_small --config.mode=hybrid --config.trainer.steps=200
python -m experiments.gpt2_small --workdir=runs/my_run            # resumes if it holds a run
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
from absl import app

from hybridjax import checkpoint as ckpt_lib
from hybridjax import cli, preflight
from hybridjax import config as config_lib
from hybridjax import sharding as sharding_lib
from hybridjax.loop import train as train_lib
from hybridjax.models import gpt2, hf
from hybridjax.tasks import gpt2 as gpt2_task
from hybridjax.tasks.gpt2 import MAX_EPOCHS, Task, benchmark_notes, build_task, corpus_epochs, epochs_warning

__all__ = [
  "MAX_EPOCHS",
  "Task",
  "benchmark_notes",
  "build_task",
  "corpus_epochs",
  "epochs_warning",
  "run",
  "write_hf_safetensors",
]

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "gpt2_small.py")


def write_hf_safetensors(workdir: str, path: str, *, step: int | None = None, averaged: bool = True) -> gpt2.GPT2Config:
  """Writes a GPT-2 run's params (`hybridjax.export_params`) as a Hugging Face `GPT2LMHeadModel`
  state dict in `.safetensors` (the head tied to `wte`, as `hf.to_hf_state_dict` writes it).
  The model shape comes from the checkpoint's own config record. Returns that shape."""
  from safetensors.numpy import save_file

  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"), async_save=False)
  try:
    latest = manager.latest_step()
    if latest is None:
      raise FileNotFoundError(f"{workdir} holds no checkpoint: pass the --workdir of a GPT-2 run")
    meta = ckpt_lib.read_meta(manager, latest if step is None else step)
  finally:
    manager.close()
  model = meta.get("config", {}).get("model")
  if not model:
    raise ValueError(f"{workdir} was not trained by experiments.gpt2_small (its config has no model block)")
  model_cfg = gpt2.GPT2Config(**model)
  params = ckpt_lib.export_params(workdir, step=step, averaged=averaged)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  save_file(hf.to_hf_state_dict(params, model_cfg), path)
  return model_cfg


def preset_configs(config: ml_collections.ConfigDict) -> list[ml_collections.ConfigDict]:
  """The config's own preset, its variants included (`config.preset`, e.g. 'tiny,speedrun'): a field
  set from Python that the run does not read is refused when its value differs from the preset's
  (`preflight.check_inert_settings`); a config without a preset compares with `default_config()`."""
  from experiments.configs import gpt2_small as presets

  if not config.get("preset"):
    return preflight.reference_configs(config)
  return [presets.get_config(str(config.preset))]


def check_speedrun_derivations(config: ml_collections.ConfigDict) -> None:
  """Refuses a speedrun config with a value a trick derives from a field changed after `get_config`
  (`presets.stale_derived_fields`): from Python, `c.trainer.steps = 100` after
  `get_config('tiny,speedrun')` kept the momentum warm-up of 600 steps, and the run would train with it."""
  from experiments.configs import gpt2_small as presets

  stale = presets.stale_derived_fields(config)
  if not stale:
    return
  raise ValueError(
    "this speedrun config keeps values its tricks derived for another config: "
    + ", ".join(f"--config.{k}={v!r}, where the recipe derives {d!r} for this config" for k, (v, d) in stale.items())
    + ". A field they derive from (trainer.steps, the model's shape) changed after get_config. Set them to the "
    "derived values, or build the config as the command line does: experiments.configs.gpt2_small."
    "after_command_line(config, '<preset>,speedrun', [the dotted fields you set]) once you have set them"
  )


def check_speedrun_depth(config: ml_collections.ConfigDict) -> None:
  """Refuses a speedrun config whose model is too shallow for the recipe's layer-pairing tricks, with
  the recipe named: validation alone blames `model.unet_skips` and `model.value_embeds`, fields the
  user of `tiny,micro,speedrun` (one layer) never set."""
  from experiments.configs import gpt2_small as presets

  if not str(config.get("notes", "")).startswith(presets.SPEEDRUN_NOTE):
    return
  m = config.model
  n_layer, k = int(m.n_layer), int(m.get("value_embeds", 0))
  problems, ways_out = [], []
  if m.get("unet_skips", False) and n_layer % 2:
    problems.append(
      "U-net skips (#11) pair the first half's layers with the second half's, which needs an even n_layer"
    )
    ways_out.append("--config.model.unet_skips=False")
  if 2 * k > n_layer:
    problems.append(
      f"value embeddings (#14-#17, model.value_embeds={k}) reach {k} first and {k} last layers, distinct, "
      f"which needs n_layer >= {2 * k}"
    )
    ways_out.append("--config.model.value_embeds=0")
  if problems:
    layers = "an even --config.model.n_layer" if "unet" in ways_out[0] else "a --config.model.n_layer"
    raise ValueError(
      f"the speedrun recipe's {'; its '.join(problems)}: model.n_layer is {n_layer}"
      f"{' (`micro` is one layer)' if n_layer == 1 else ''}. Use {layers} of at least {max(2, 2 * k)} "
      f"(`tiny,speedrun` has 2), or train the recipe without {'them' if len(problems) > 1 else 'it'}: "
      + " ".join(ways_out)
    )


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  given = cli.command_line_fields(sys.argv)  # a field given there that the run does not read is refused
  cli.run_as_program(lambda: run(_FLAGS[0].value, _FLAGS[1].value, given=given))


def run(config: ml_collections.ConfigDict, workdir: str = "", given: Sequence[str] = ()) -> dict[str, Any]:
  """Validates `config`, builds the task and trains; returns the run summary. `given`: the fields the
  command line set (dotted names), refused whatever their value where the run does not read them."""
  # A user's method brings its block (`hybrid.<CONFIG_KEY>`, at its defaults where unset) before the
  # checks, which read it.
  config = config_lib.with_method_block(ml_collections.ConfigDict(config.to_dict()))
  check_speedrun_depth(config)  # before validation, whose errors would not name the recipe
  preflight.validate(config)
  check_speedrun_derivations(config)
  references = preset_configs(config)
  method = config_lib.resolve_method(config)
  preflight.check_inert_settings(config, method, references, given=given)  # before the data
  gpt2_task.check_gpt2_task(config)
  # Multi-host start-up must come before anything touches JAX devices (a no-op unless enabled).
  sharding_lib.initialize_distributed(config)
  workdir = workdir or cli.default_workdir(config)
  task = build_task(config)
  n_params = task.extra_meta["n_params"]
  print(
    f"GPT-2 {config.preset}: {n_params:,} params ({task.extra_meta['attention']} attention), "
    f"{task.prepared.n_train:,} train tokens "
    f"({config.data.tokenizer}; the run reads them {corpus_epochs(config, task.prepared.n_train):.2f} times), "
    f"mode={config.mode}, workdir={workdir}, devices={jax.devices()}"
  )
  if config.get("notes"):
    print(f"note: {config.notes}")
  warning = epochs_warning(config, task.prepared.n_train)
  if warning:
    print(warning)
  return train_lib.train(config, workdir, reference_configs=references, **task.train_kwargs())


if __name__ == "__main__":
  _FLAGS = cli.define_flags(_CONFIG_PATH + ":tiny", "Run directory (default: runs/<preset>-<mode>-<time>).")
  cli.run_app(main)
