"""The names hybrid training counts in: phases, step kinds (branches), health events, exits.

This module imports nothing, so the plots, the config checks and the feature vector share one
definition. Metrics and checkpoints store the integer values; the names are for people.
"""

from __future__ import annotations

import enum


class Phase(enum.IntEnum):
  """The controller's phase (`Controller.phase`)."""

  WARMUP = 0  # real steps that train the trajectory model; no prediction yet
  FULL = 1  # real steps while confidence is below the threshold
  PREDICT = 2  # predicted steps: theta <- theta + sum_g alpha_g velocity_g, no backward pass
  CORRECT = 3  # real steps after a PREDICT phase; its first step rolls back what diverged


PHASE_NAMES: tuple[str, ...] = tuple(p.name for p in Phase)


class Branch(enum.IntEnum):
  """The step kind the next call runs (`Controller.next_branch`): the index the fused step selects by."""

  FULL_STEP = 0  # WARMUP, FULL and CORRECT real steps, and micro-corrections inside PREDICT
  PREDICT_STEP = 1
  CORRECT_STEP = 2  # the first CORRECT step: rollback, corrector update, then a full step


BRANCH_NAMES: tuple[str, ...] = ("full_step", "predict_step", "correct_step")

# Health events, in the order of `Controller.events`.
EVENT_NAMES: tuple[str, ...] = ("nonfinite", "grad_explosion", "loss_spike", "prediction_failure")


class Exit(enum.IntEnum):
  """Why the last PREDICT phase ended (`Controller.last_exit`)."""

  NONE = 0
  HORIZON = 1
  DIVERGED = 2
  NONFINITE = 3
