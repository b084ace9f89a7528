"""What every study's record starts with (`header`: its command, date, machine, config), and the
invocations of a resumed study."""

from __future__ import annotations

import datetime
import json
import os
import platform
from typing import Any

import jax
import ml_collections

from hybridjax.bench import specs


def machine_info() -> dict[str, Any]:
  dev = jax.devices()[0]
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count()
  return {
    "platform": dev.platform,
    "device_kind": dev.device_kind,
    "device_count": jax.device_count(),
    "cpu_cores": cores,
    "python": platform.python_version(),
    "jax": jax.__version__,
    "machine": platform.machine(),
    "load_average_1m": os.getloadavg()[0],
  }


def earlier_invocations(path: str) -> list[dict[str, Any]]:
  """The invocations an earlier ladder or recipe recorded in its json at `path` (one resumed from
  its cache reports the compute of every invocation, not only its own); [] when there is none."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f).get("invocations", [])


def header(config: ml_collections.ConfigDict, command: str) -> dict[str, Any]:
  """The fields every study's record starts with."""
  return {
    "preset": config.benchmark.preset,
    "task": specs.task_name(config),
    "command": command,
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "machine": machine_info(),
    "config": json.loads(config.to_json()),
    "steps": int(config.trainer.steps),
  }
