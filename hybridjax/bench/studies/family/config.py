"""The family protocol's fields are the benchmark block's own (`specs.validate_benchmark` checks them);
its check of the publish folder (`check_publish`)."""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from hybridjax.bench import record

PUBLISHED = ("benchmark.json", "headline.json", "results.md")  # a family's published record, beside its plots


def add_defaults(b: ml_collections.ConfigDict, preset: str) -> None:
  """None: a family's fields are the benchmark block's own."""
  del b, preset


def check_publish(
  config: ml_collections.ConfigDict | dict[str, Any], folder: str, ignore: tuple[str, ...] = ()
) -> None:
  """Refuses (ValueError naming --config.benchmark.publish) to publish a family of `config` into
  `folder` where it holds another family's results: a benchmark.json of another config (another
  preset, family, task or setting, `record.config_differences`; outside `ignore`), or results with
  no benchmark.json to compare with. A benchmark.json of the same config is a re-run: it is replaced."""
  if not folder:
    return
  held = [name for name in PUBLISHED if os.path.exists(os.path.join(folder, name))]
  if held and "benchmark.json" not in held:
    path = os.path.join(folder, held[0])
    raise ValueError(record.publish_refusal(folder, path, "with no benchmark.json to compare this config with"))
  record.check_publish(config, folder, "benchmark.json", record.other_studies("family") + ignore)


def validate(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """The publish folder (`check_publish`); a family trains only `config`."""
  check_publish(config, str(config.benchmark.publish))
  return {}
