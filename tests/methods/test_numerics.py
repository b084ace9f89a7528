"""Every built-in method's numerics, kept as recorded (scripts/method_numerics.py).

A refactor that moves a method's code must not change a bit of what it computes. On the machine
kind and jax the record was made with, the 300-step runs must reproduce it exactly: every logged
training loss, the final eval loss and the final params' bit checksum. XLA:CPU compiles for the
host's instruction set, so on another CPU the runs are compared to float32 rounding instead; the
assertion is as strict as the hardware lets it be, never absent.
"""

from __future__ import annotations

import json

import chex
import numpy as np
import pytest
from conftest import load_script


@pytest.mark.slow  # six 300-step runs, mostly compiling; CI runs the slow tests
def test_every_built_in_method_computes_what_it_did_when_recorded():
  numerics = load_script("method_numerics")
  with open(numerics.RECORD) as f:
    recorded = json.load(f)
  assert set(recorded["runs"]) == set(numerics.method_configs())  # a new method gets recorded too
  got = numerics.record()
  same_machine = numerics.machine() == recorded["machine"]
  for name, want in recorded["runs"].items():
    run = got[name]
    assert run["train_losses"].keys() == want["train_losses"].keys(), name  # the same steps measured
    if same_machine:
      assert run == want, f"{name}: its numerics changed"
    else:
      steps = sorted(want["train_losses"], key=int)
      chex.assert_trees_all_close(
        np.array([run["train_losses"][s] for s in steps]),
        np.array([want["train_losses"][s] for s in steps]),
        rtol=1e-3,
        custom_message=name,
      )
      chex.assert_trees_all_close(run["final_eval_loss"], want["final_eval_loss"], rtol=1e-3, custom_message=name)
