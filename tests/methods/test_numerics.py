"""Every built-in method's numerics, kept as recorded (scripts/method_numerics.py).

A refactor that moves a method's code must not change a bit of what it computes. On the machine
kind and jax the record was made with, the 300-step runs must reproduce it exactly: every logged
training loss, the final eval loss and the final params' bit checksum. XLA:CPU compiles for the
host's instruction set, so on another CPU the runs' real steps before any prediction are compared to
float32 rounding and their final eval losses to 2% (a rounding difference may flip a later phase
decision); the assertion is as strict as the hardware lets it be, never absent.
"""

from __future__ import annotations

import json

import chex
import numpy as np
import pytest
from conftest import load_script

EARLY = 10  # steps every recorded config takes as real steps (its warm-up is longer)


@pytest.mark.cross_program
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
    if same_machine:
      assert run == want, f"{name}: its numerics changed"
    else:
      # Rounding differences can flip a later phase decision (a jump accepted or not), so elsewhere
      # the check is the first EARLY steps, all real steps before any prediction, to float32
      # rounding, and the final eval loss to 2%.
      steps = sorted(want["train_losses"], key=int)[:EARLY]
      chex.assert_trees_all_close(
        np.array([run["train_losses"][s] for s in steps]),
        np.array([want["train_losses"][s] for s in steps]),
        rtol=1e-4,
        custom_message=name,
      )
      chex.assert_trees_all_close(run["final_eval_loss"], want["final_eval_loss"], rtol=2e-2, custom_message=name)
