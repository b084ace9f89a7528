"""Train GPT-2 on the bundled Shakespeare corpus (or any text), baseline or hybrid.

python -m experiments.gpt2_small                                   # tiny preset, CPU, minutes
python -m experiments.gpt2_small --config=experiments/configs/gpt2_small.py:small
python -m experiments.gpt2_small --config.mode=hybrid --config.trainer.steps=200
python -m experiments.gpt2_small --workdir=runs/my_run            # resumes if it holds a run
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
from absl import app

from hybridjax import checkpoint as ckpt_lib
from hybridjax import cli
from hybridjax import config as config_lib
from hybridjax import data as data_lib
from hybridjax import sharding as sharding_lib
from hybridjax.loop import train as train_lib
from hybridjax.models import gpt2
from hybridjax.optim import Batch, LossFn

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "gpt2_small.py")


@dataclasses.dataclass
class Task:
  """Everything `loop.train.train` needs besides the config, for one GPT-2 experiment."""

  init_params: Callable[[jax.Array], Any]
  loss_fn: LossFn
  train_batch: Callable[[int], Batch]
  eval_batches: list[Batch]
  tokens_per_step: int
  extra_meta: dict[str, Any]
  model: gpt2.GPT2
  prepared: data_lib.PreparedData

  def train_kwargs(self) -> dict[str, Any]:
    """The keyword arguments of `loop.train.train`."""
    return dict(
      init_params=self.init_params,
      loss_fn=self.loss_fn,
      train_batch=self.train_batch,
      eval_batches=self.eval_batches,
      tokens_per_step=self.tokens_per_step,
      extra_meta=self.extra_meta,
    )


def build_task(config: ml_collections.ConfigDict) -> Task:
  """Data, model and loss for `config`; raises ValueError on anything inconsistent."""
  model_cfg = gpt2.GPT2Config(**config.model.to_dict())
  model_cfg.validate()
  prepared = data_lib.prepare_corpus(
    config.data.path or None,
    config.data.tokenizer,
    cache_dir=config.data.cache_dir or None,
    val_fraction=config.data.val_fraction,
  )
  data_lib.check_vocab(prepared, model_cfg.vocab_size)
  train_tokens = data_lib.load_tokens(prepared.train_path)
  val_tokens = data_lib.load_tokens(prepared.val_path)
  seq_len = model_cfg.n_ctx
  for name, toks in (("train", train_tokens), ("val", val_tokens)):
    if len(toks) < seq_len + 1:
      raise ValueError(
        f"the {name} split has {len(toks)} tokens, fewer than one sequence of "
        f"model.n_ctx + 1 = {seq_len + 1}: use a larger corpus (--config.data.path) or a "
        "smaller --config.model.n_ctx"
      )
  model = gpt2.GPT2(model_cfg)
  batch_size, seed = config.trainer.batch_size, config.seed

  def init_params(rng):
    dummy = jax.numpy.zeros((1, seq_len), jax.numpy.int32)
    return model.init(rng, dummy)["params"]

  def train_batch(step):
    return data_lib.get_batch(
      train_tokens, seed=seed, step=step, batch_size=batch_size, seq_len=seq_len, vocab_size=model_cfg.vocab_size
    )

  eval_batches = data_lib.eval_batches(
    val_tokens,
    batch_size=batch_size,
    seq_len=seq_len,
    n_batches=config.trainer.eval_batches,
    vocab_size=model_cfg.vocab_size,
  )
  n_params = gpt2.count_params(jax.eval_shape(init_params, jax.random.PRNGKey(0)))
  return Task(
    init_params=init_params,
    loss_fn=gpt2.make_loss_fn(model),
    train_batch=train_batch,
    eval_batches=eval_batches,
    tokens_per_step=batch_size * seq_len,
    extra_meta={
      "data": {"tokenizer": prepared.tokenizer, "n_train": prepared.n_train, "n_val": prepared.n_val},
      "n_params": n_params,
    },
    model=model,
    prepared=prepared,
  )


MAX_EPOCHS = 4.0


def corpus_epochs(config: ml_collections.ConfigDict, n_train_tokens: int) -> float:
  """How many times a run of `config.trainer.steps` steps reads its training split (in tokens)."""
  return config.trainer.steps * config.trainer.batch_size * config.model.n_ctx / max(n_train_tokens, 1)


def epochs_warning(config: ml_collections.ConfigDict, n_train_tokens: int) -> str | None:
  """A warning when a run repeats its corpus more than `MAX_EPOCHS` times (a small corpus is
  memorised, and losses stop meaning generalisation), naming the fix."""
  epochs = corpus_epochs(config, n_train_tokens)
  if epochs <= MAX_EPOCHS:
    return None
  return (
    f"WARNING: {config.trainer.steps} steps read the {n_train_tokens:,}-token training split {epochs:.1f} times "
    f"(more than {MAX_EPOCHS:g}); give a larger corpus with --config.data.path, or fewer steps"
  )


def write_hf_safetensors(workdir: str, path: str, *, step: int | None = None, averaged: bool = True) -> gpt2.GPT2Config:
  """Writes a GPT-2 run's params (`hybridjax.export_params`) as a Hugging Face `GPT2LMHeadModel`
  state dict in `.safetensors` (the head tied to `wte`, as `gpt2.to_hf_state_dict` writes it).
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
  save_file(gpt2.to_hf_state_dict(params, model_cfg), path)
  return model_cfg


def benchmark_notes(config: ml_collections.ConfigDict, budget_steps: dict[str, int]) -> dict[str, Any]:
  """What a benchmark reports of this task's data: how many times each budget (name -> steps) reads
  the training split, a line that says so, and a warning past `MAX_EPOCHS`."""
  prepared = build_task(config).prepared
  epochs = {}
  for name, steps in budget_steps.items():
    c = ml_collections.ConfigDict(config.to_dict())
    c.trainer.steps = steps
    epochs[name] = corpus_epochs(c, prepared.n_train)
  longest = ml_collections.ConfigDict(config.to_dict())
  longest.trainer.steps = max(budget_steps.values())
  warning = epochs_warning(longest, prepared.n_train)
  return {
    "corpus_epochs": epochs,
    "lines": [
      f"the longest budget reads the {prepared.n_train:,}-token training split {max(epochs.values()):.2f} times"
    ]
    + ([warning] if warning else []),
  }


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.run_as_program(lambda: run(_FLAGS[0].value, _FLAGS[1].value))


def run(config: ml_collections.ConfigDict, workdir: str = "") -> dict[str, Any]:
  """Validates `config`, builds the task and trains; returns the run summary."""
  config_lib.validate(config)
  # Multi-host start-up must come before anything touches JAX devices (a no-op unless enabled).
  sharding_lib.initialize_distributed(config)
  workdir = workdir or cli.default_workdir(config)
  task = build_task(config)
  n_params = task.extra_meta["n_params"]
  print(
    f"GPT-2 {config.preset}: {n_params:,} params, {task.prepared.n_train:,} train tokens "
    f"({config.data.tokenizer}; the run reads them {corpus_epochs(config, task.prepared.n_train):.2f} times), "
    f"mode={config.mode}, workdir={workdir}, devices={jax.devices()}"
  )
  warning = epochs_warning(config, task.prepared.n_train)
  if warning:
    print(warning)
  return train_lib.train(config, workdir, **task.train_kwargs())


if __name__ == "__main__":
  _FLAGS = cli.define_flags(_CONFIG_PATH + ":tiny", "Run directory (default: runs/<preset>-<mode>-<time>).")
  app.run(main)
