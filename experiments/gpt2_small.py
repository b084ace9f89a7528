"""Train GPT-2 on the bundled Shakespeare corpus (or any text), baseline or hybrid.

  python -m experiments.gpt2_small                                   # tiny preset, CPU, minutes
  python -m experiments.gpt2_small --config=experiments/configs/gpt2_small.py:small
  python -m experiments.gpt2_small --config.mode=hybrid --config.trainer.steps=200
  python -m experiments.gpt2_small --workdir=runs/my_run            # resumes if it holds a run
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any, Callable

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from hybridjax import config as config_lib
from hybridjax import data as data_lib
from hybridjax import sharding as sharding_lib
from hybridjax import trainer
from hybridjax.models import gpt2

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "gpt2_small.py")


def define_flags() -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """--config and --workdir; defined only when run as a program, so importing has no side effects."""
  return (config_flags.DEFINE_config_file("config", _CONFIG_PATH + ":tiny",
                                          "Experiment config file[:preset]."),
          flags.DEFINE_string("workdir", "", "Run directory (default: runs/<preset>-<mode>-<time>)."))


def build_task(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Data, model and loss for `config`; raises ValueError on anything inconsistent."""
  model_cfg = gpt2.GPT2Config(**config.model.to_dict())
  model_cfg.validate()
  prepared = data_lib.prepare_corpus(config.data.path or None, config.data.tokenizer,
                                     cache_dir=config.data.cache_dir or None,
                                     val_fraction=config.data.val_fraction)
  data_lib.check_vocab(prepared, model_cfg.vocab_size)
  train_tokens = data_lib.load_tokens(prepared.train_path)
  val_tokens = data_lib.load_tokens(prepared.val_path)
  seq_len = model_cfg.n_ctx
  for name, toks in (("train", train_tokens), ("val", val_tokens)):
    if len(toks) < seq_len + 1:
      raise ValueError(
          f"the {name} split has {len(toks)} tokens, fewer than one sequence of "
          f"model.n_ctx + 1 = {seq_len + 1}: use a larger corpus (--config.data.path) or a "
          "smaller --config.model.n_ctx")
  model = gpt2.GPT2(model_cfg)
  batch_size, seed = config.trainer.batch_size, config.seed

  def init_params(rng):
    dummy = jax.numpy.zeros((1, seq_len), jax.numpy.int32)
    return model.init(rng, dummy)["params"]

  def train_batch(step):
    return data_lib.get_batch(train_tokens, seed=seed, step=step, batch_size=batch_size,
                              seq_len=seq_len, vocab_size=model_cfg.vocab_size)

  eval_batches = data_lib.eval_batches(val_tokens, batch_size=batch_size, seq_len=seq_len,
                                       n_batches=config.trainer.eval_batches,
                                       vocab_size=model_cfg.vocab_size)
  return dict(init_params=init_params, loss_fn=gpt2.make_loss_fn(model), train_batch=train_batch,
              eval_batches=eval_batches, tokens_per_step=batch_size * seq_len,
              extra_meta={"data": {"tokenizer": prepared.tokenizer, "n_train": prepared.n_train,
                                   "n_val": prepared.n_val},
                          "n_params": None},
              model=model, prepared=prepared)


def default_workdir(config: ml_collections.ConfigDict) -> str:
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{config.preset}-{config.mode}-{stamp}")


def run_as_program(work: Callable[[], Any]) -> None:
  """Runs `work()` as a command-line program: bad input and divergence end in a one-line error.

  Bad input (ValueError, FileNotFoundError; the message says what to change) exits 2, a diverged
  run (`trainer.TrainingDiverged`; the message names the step, the count and the fix) exits 3.
  HYBRIDJAX_TRACEBACK=1 re-raises instead.
  """
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  try:
    work()
  except (ValueError, FileNotFoundError) as e:
    if os.environ.get("HYBRIDJAX_TRACEBACK"):
      raise
    print(f"error: {e}\n(set HYBRIDJAX_TRACEBACK=1 to see the traceback)", file=sys.stderr)
    sys.exit(2)
  except trainer.TrainingDiverged as e:
    if os.environ.get("HYBRIDJAX_TRACEBACK"):
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(3)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  run_as_program(lambda: run(_FLAGS[0].value, _FLAGS[1].value))


def run(config: ml_collections.ConfigDict, workdir: str = "") -> dict[str, Any]:
  """Validates `config`, builds the task and trains; returns the run summary."""
  config_lib.validate(config)
  # Multi-host start-up must come before anything touches JAX devices (a no-op unless enabled).
  sharding_lib.initialize_distributed(config)
  workdir = workdir or default_workdir(config)
  task = build_task(config)
  n_params = gpt2.count_params(jax.eval_shape(task["init_params"], jax.random.PRNGKey(0)))
  task["extra_meta"]["n_params"] = n_params
  print(f"GPT-2 {config.preset}: {n_params:,} params, {task['prepared'].n_train:,} train tokens "
        f"({config.data.tokenizer}), mode={config.mode}, workdir={workdir}, "
        f"devices={jax.devices()}")
  return trainer.train(config, workdir, init_params=task["init_params"], loss_fn=task["loss_fn"],
                       train_batch=task["train_batch"], eval_batches=task["eval_batches"],
                       tokens_per_step=task["tokens_per_step"], extra_meta=task["extra_meta"])


if __name__ == "__main__":
  _FLAGS = define_flags()
  app.run(main)
