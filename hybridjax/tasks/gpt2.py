"""The GPT-2 task: a GPT-2 (`models.gpt2`) on a corpus, byte or BPE (`data.prepare_corpus`; the bundled
Shakespeare by default), as `loop.train.train`'s keyword arguments. `experiments/gpt2_small.py`
trains it; the benchmark loads it as `benchmark.task='gpt2'`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from hybridjax import data as data_lib
from hybridjax import schema
from hybridjax.models import attention, gpt2
from hybridjax.optim import Batch, LossFn


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
    names = ("init_params", "loss_fn", "train_batch", "eval_batches", "tokens_per_step", "extra_meta")
    return {name: getattr(self, name) for name in names}


# The config blocks this task reads (`bench.tasks.reads`): a field of another task's block set for it
# is refused, not recorded and ignored.
READS = ("model", "data")


def build_task(config: ml_collections.ConfigDict) -> Task:
  """Data, model and loss for `config`; raises ValueError on anything inconsistent."""
  model_cfg = gpt2.GPT2Config(**config.model.to_dict())
  model_cfg.validate()
  default_fraction = next(f.default for f in data_lib.DATA_FIELDS if f.name == "val_fraction")
  if data_lib.split_folders(config.data.path) and float(config.data.val_fraction) != default_fraction:
    raise ValueError(
      f"--config.data.val_fraction={config.data.val_fraction} has no effect: --config.data.path="
      f"{config.data.path!r} holds its own train/ and val/ folders, which are the held-out split; leave "
      f"data.val_fraction at {default_fraction}"
    )
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
    return model.init(rng, jax.numpy.zeros((1, seq_len), jax.numpy.int32))["params"]

  def train_batch(step):
    return data_lib.get_batch(
      train_tokens, seed=seed, step=step, batch_size=batch_size, seq_len=seq_len, vocab_size=model_cfg.vocab_size
    )

  if config.data.get("order", "random") == "no_repeat":  # refused before anything trains where it runs out
    data_lib.check_no_repeat(len(train_tokens), seq_len, int(config.trainer.steps), batch_size)
    train_batch = data_lib.no_repeat_batches(
      train_tokens, seed=seed, batch_size=batch_size, seq_len=seq_len, vocab_size=model_cfg.vocab_size
    )

  return Task(
    init_params=init_params,
    loss_fn=gpt2.make_loss_fn(model),
    train_batch=train_batch,
    eval_batches=data_lib.eval_batches(
      val_tokens,
      batch_size=batch_size,
      seq_len=seq_len,
      n_batches=config.trainer.eval_batches,
      vocab_size=model_cfg.vocab_size,
    ),
    tokens_per_step=batch_size * seq_len,
    extra_meta={
      "data": {"tokenizer": prepared.tokenizer, "n_train": prepared.n_train, "n_val": prepared.n_val},
      "n_params": gpt2.count_params(jax.eval_shape(init_params, jax.random.PRNGKey(0))),
      # The attention's path on this backend (the run key does not see the backend).
      "attention": attention.attention_implementation(model_cfg, attention.current_backend()),
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


def benchmark_notes(config: ml_collections.ConfigDict, budget_steps: dict[str, int]) -> dict[str, Any]:
  """What a benchmark reports of this task's data: how many times each budget (name -> steps) reads
  the training split, a line that says so, and a warning past `MAX_EPOCHS`."""
  prepared = build_task(config).prepared

  def steps_of(steps: int) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(config.to_dict())
    c.trainer.steps = steps
    return c

  epochs = {name: corpus_epochs(steps_of(steps), prepared.n_train) for name, steps in budget_steps.items()}
  warning = epochs_warning(steps_of(max(budget_steps.values())), prepared.n_train)
  return {
    "corpus_epochs": epochs,
    "lines": [
      f"the longest budget reads the {prepared.n_train:,}-token training split {max(epochs.values()):.2f} times"
    ]
    + ([warning] if warning else []),
  }


def gpt2_task_errors(config: ml_collections.ConfigDict) -> list[str]:
  """Model settings the GPT-2 task (`tasks.gpt2`, the CLI's and the benchmark's) would record but not
  apply: `model.dropout` > 0, since its batches carry no `dropout_rng` and `models.gpt2.make_loss_fn`
  runs the forward pass deterministic without one."""
  dropout = float(config.get("model", {}).get("dropout", 0.0))
  if dropout > 0:
    return [
      f"--config.model.dropout={dropout} is set but not applied: the GPT-2 task's batches carry no dropout key "
      "(dropout_rng), so every forward pass is deterministic. Leave --config.model.dropout at 0, or train "
      "through hybridjax.train with batches that hold a 'dropout_rng' (models.gpt2.make_loss_fn)"
    ]
  return []


def check_gpt2_task(config: ml_collections.ConfigDict) -> None:
  """Refuses what `gpt2_task_errors` names."""
  schema.raise_invalid(gpt2_task_errors(config))
