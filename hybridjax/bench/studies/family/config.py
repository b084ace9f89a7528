"""The family protocol's fields are the benchmark block's own (`specs.validate_benchmark` checks them)."""

from __future__ import annotations

import ml_collections


def add_defaults(b: ml_collections.ConfigDict, preset: str) -> None:
  """None: a family's fields are the benchmark block's own."""
  del b, preset


def validate(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Nothing beyond the benchmark block's checks: a family trains only `config`."""
  del config
  return {}
