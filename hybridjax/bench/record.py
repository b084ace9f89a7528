"""What every study's record starts with (`header`: its command, date, machine, config), the
invocations of a resumed study, and the config of a record written before the study blocks."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from hybridjax.bench import specs


def machine_info() -> dict[str, Any]:
  dev = jax.devices()[0]
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
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


def stored(path: str) -> dict[str, Any]:
  """The record at `path` ({} where there is none): an earlier invocation's, whose invocations a
  resumed ladder or recipe extends (it reports the compute of every invocation, not only its own)."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def write_files(
  result: dict[str, Any], folder: str, record: str, markdown: Callable, plot: Callable | None = None
) -> None:
  """A study's `result` into `folder`: its json (`record`, e.g. 'recipe-{preset}.json', formatted
  with the result's fields), markdown and plot (None: it draws none)."""
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, record.format(**result))
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  with open(path[: -len(".json")] + ".md", "w") as f:
    f.write(markdown(result) + "\n")
  if plot is not None:
    plot(result, folder)


def stored_config(result: dict[str, Any]) -> ml_collections.ConfigDict:
  """The config a record holds, in today's shape: a record written before the study blocks holds
  their fields flat in the benchmark block (`specs.MOVED`) and `ladder` / `recipe` as booleans."""
  config = json.loads(json.dumps(result["config"]))
  b = {k: v for k, v in config["benchmark"].items() if k not in specs.OLD_FLAGS or isinstance(v, dict)}
  for old in [f for f in specs.MOVED if f in b]:
    block, field = specs.MOVED[old].split(".")
    b.setdefault(block, {})[field] = b.pop(old)
  return ml_collections.ConfigDict(config | {"benchmark": b})


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's


def relative_folders(command: str) -> str:
  """`command` with its `--workdir` and `--config.benchmark.publish` folders relative to the repository
  when they lie inside it (a record names no folder of one machine), the others as given."""

  def relative(m: re.Match) -> str:
    path = os.path.abspath(m[2])
    return m[1] + (os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else m[2])

  return re.sub(r"((?:^|\s)--(?:workdir|config\.benchmark\.publish)[= ])(\S+)", relative, command)


def header(config: ml_collections.ConfigDict, command: str) -> dict[str, Any]:
  """The fields every study's record starts with (its command with `relative_folders`)."""
  return {
    "preset": config.benchmark.preset,
    "task": specs.task_name(config),
    "command": relative_folders(command),
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "machine": machine_info(),
    "config": json.loads(config.to_json()),
    "steps": int(config.trainer.steps),
  }
