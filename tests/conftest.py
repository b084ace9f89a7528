"""Shared fixtures: a tiny GPT-2 config that trains in seconds, and an isolated data cache."""

from __future__ import annotations

import os

import pytest

# Keep tests off the user's caches and make CPU runs deterministic and quiet.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
  cache = tmp_path_factory.getbasetemp() / "hybridjax_cache"
  monkeypatch.setenv("HYBRIDJAX_CACHE", str(cache))


def micro_config(mode: str = "baseline", steps: int = 20):
  """The `tiny,micro` preset with test-sized logging: no evals or checkpoints before the end."""
  from experiments.configs import gpt2_small
  c = gpt2_small.get_config("tiny,micro")
  c.mode = mode
  c.trainer.update(steps=steps, log_every=5, eval_every=0, eval_batches=2, checkpoint_every=0,
                   progress=False, compile_cache=False)
  return c


# Hybrid overrides that cycle through every phase quickly on the test MLP.
STD = dict(confidence_threshold=0.0, max_predict_steps=4, divergence_tolerance=0.5,
           correction_interval=2)


def small_hybrid_config(**overrides):
  """`config.hybrid` with a small RSSM and short warm-up; keys may be dotted ('rssm.deter')."""
  from hybridjax import config as config_lib
  h = config_lib.default_hybrid_config()
  h.warmup_steps = 10
  h.full_steps = 5
  h.rssm.deter, h.rssm.latent, h.rssm.hidden, h.rssm.ensemble = 32, 8, 32, 2
  h.history_size, h.window = 16, 8
  h.update_from_flattened_dict(overrides)
  return h
