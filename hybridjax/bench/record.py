"""What every study's record starts with (`header`: its command, date, machine, config), the
invocations of a resumed study, the config of a record written before the study blocks, and the
check that a publish neither replaces nor mixes a published record of another config
(`config_differences`, `check_publish`)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
from collections.abc import Callable
from typing import Any

import jax

from hybridjax import identity
from hybridjax.bench import specs
from hybridjax.bench.speedrun import RESULTS, shown_path
from hybridjax.bench.studies import STUDIES, Config, Record


def machine_info() -> Record:
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


def stored(path: str) -> Record:
  """The record at `path` ({} where there is none): an earlier invocation's, whose invocations a
  resumed ladder or recipe extends (it reports the compute of every invocation, not only its own)."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def both_tuned_record(config: Config, field: str, run_it: str, required: bool = True) -> tuple[str, Record | None]:
  """(its path, the record) of the cell `both_tuned` record `benchmark.<field>` (dotted: 'knobs.rows_from')
  names ('': the one published at this preset; None where none is and `required` is False). A missing one is
  refused naming the field and what makes one (`run_it`)."""
  block, name = field.split(".")
  given = str(config.benchmark[block][name])
  path = given or os.path.join(RESULTS, "optimizers", f"optimizers-both_tuned-{config.benchmark.preset}.json")
  if not os.path.exists(path):
    if not (given or required):
      return path, None
    raise ValueError(
      f"--config.benchmark.{field}: no cell 'both_tuned' record at {path}: run {run_it} at this preset first, "
      "or give its record"
    )
  return path, stored(path)


def write_files(result: Record, folder: str, record: str, markdown: Callable, plot: Callable | None = None) -> None:
  """A study's `result` into `folder`: its json (`record`, e.g. 'recipe-{preset}.json', formatted
  with the result's fields), markdown and plot (None: it draws none)."""
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, record.format(**result))
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  with open(path.removesuffix(".json") + ".md", "w") as f:
    f.write(markdown(result) + "\n")
  if plot is not None:
    plot(result, folder)


def stored_config(result: Record) -> Config:
  """The config a record holds, in today's shape: a record written before the study blocks holds
  their fields flat in the benchmark block (`specs.MOVED`) and `ladder` / `recipe` as booleans."""
  config = json.loads(json.dumps(result["config"]))
  b = {k: v for k, v in config["benchmark"].items() if k not in specs.OLD_FLAGS or isinstance(v, dict)}
  for old in [f for f in specs.MOVED if f in b]:
    block, field = specs.MOVED[old].split(".")
    b.setdefault(block, {})[field] = b.pop(old)
  return Config(config | {"benchmark": b})


def relative_folders(command: str) -> str:
  """`command` with its `--workdir` and `--config.benchmark.publish` folders relative to the repository
  when they lie inside it (a record names no folder of one machine), the others as given (`shown_path`)."""
  return re.sub(
    r"((?:^|\s)--(?:workdir|config\.benchmark\.publish)[= ])(\S+)", lambda m: m[1] + shown_path(m[2]), command
  )


def header(config: Config, command: str) -> Record:
  """The fields every study's record starts with (its command with `relative_folders`)."""
  return {
    "preset": config.benchmark.preset,
    "task": specs.task_name(config),
    "command": relative_folders(command),
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "machine": machine_info(),
    "config": json.loads(config.to_json()),
    "steps": int(config.trainer.steps),
    "task_seeds": specs.task_seeds_record(config),
  }


# Fields that say how and where a study ran and where it is published, never what it measured: two
# records differing only in these hold the same measurement. The experiment fields declared to run on
# a host (`schema.Field.runtime == 'host'`: the compile cache, the mesh, progress bars), the GPT-2
# task's token cache, and the benchmark's own (`specs.RUNTIME`).
RUNTIME = identity.runtime_fields("host") | {f"benchmark.{f}" for f in specs.RUNTIME}
FIRST_SHOWN = ("benchmark.preset", "benchmark.family", "benchmark.task", "trainer.steps")  # named first


def config_differences(
  earlier: Config | Record,
  later: Config | Record,
  ignore: tuple[str, ...] = (),
) -> list[str]:
  """The fields whose values differ between two configs (a published record's, `stored_config`'s,
  and another's) as a run reads them (`identity.comparable`), as 'field: <earlier> there, <later>
  here' lines, `FIRST_SHOWN` first; outside `RUNTIME` and `ignore` (dotted fields, or blocks:
  'benchmark.knobs' ignores its fields).
  A field one config lacks (its record was written before the field existed) compares as its default
  (`identity.field_defaults`); one with no default (a benchmark field or study block added since) is
  not compared: the older record cannot say what it was."""
  defaults, absent = identity.field_defaults(), object()
  a, b = identity.comparable(earlier), identity.comparable(later)
  shown = {k: i for i, k in enumerate(FIRST_SHOWN)}
  diffs = []
  for k in sorted(set(a) | set(b), key=lambda k: (shown.get(k, len(shown)), k)):
    old, new = (plain(c.get(k, defaults.get(k, absent))) for c in (a, b))
    ignored = k in RUNTIME or any(k == i or k.startswith(i + ".") for i in ignore)
    if not ignored and absent not in (old, new) and old != new:
      diffs.append(f"{k}: {old!r} there, {new!r} here")
  return diffs


def plain(value: Any) -> Any:
  """`value` with its lists as tuples, so a default read from json (or a config field set as a list) equals a
  config's tuple."""
  return tuple(plain(v) for v in value) if isinstance(value, (list, tuple)) else value


def other_studies(study: str) -> tuple[str, ...]:
  """The blocks of the studies `study` does not read (`benchmark.<name>` of `STUDIES`; the family has none): a record
  of `study` compares without them. Every study but the family reads the recipe's block (the ladder's
  R6, the variants' and knobs' rows are the recipe's), and a speedrun family is the recipe whole."""
  return tuple(f"benchmark.{s}" for s in STUDIES if s not in (study, "recipe", "family"))


def _shown(lines: list[str], k: int) -> str:
  """The first `k` of `lines`, and how many more."""
  return "; ".join(lines[:k]) + (f"; and {len(lines) - k} more" if len(lines) > k else "")


def publish_refusal(folder: str, path: str, why: str, lines: list[str] = ()) -> str:
  """The error of a publish refused because `folder` holds `path` (`why`), its config differences
  (`lines`, the first five shown): the fix is another folder, or deleting the published record."""
  shown = _shown(lines, 5)
  return (
    f"--config.benchmark.publish={folder!r} holds {path}, {why}{' (' + shown + ')' if shown else ''}: publishing "
    "here would replace or mix published results. Give --config.benchmark.publish another folder (or '' to "
    f"publish nothing), or delete {path} deliberately to replace it"
  )


def check_publish(config: Config | Record, folder: str, name: str, ignore: tuple[str, ...] = ()) -> None:
  """Refuses (ValueError, `publish_refusal`) to publish a record of `config` as `folder/name` where
  the record there holds another config (`config_differences`, outside `ignore`); a record of the
  same config is a re-run, which replaces it."""
  path = os.path.join(folder, name)
  earlier = stored(path)
  if earlier:
    lines = config_differences(stored_config(earlier), config, ignore)
    if lines:
      raise ValueError(publish_refusal(folder, path, "a record of another config", lines))


def check_study_publish(config: Config, study: str, record: str, **fields: Any) -> None:
  """`check_publish` of the study `study`'s record `record` (formatted with the preset, the fields of the
  study's block and `fields`) in `benchmark.publish`, outside the other studies' blocks (`other_studies`)."""
  b = config.benchmark
  name = record.format(preset=b.preset, **b[study], **fields)
  check_publish(config, str(b.publish), name, other_studies(study))


def write_and_publish(
  result: Record,
  workdir: str,
  publish: str,
  record: str,
  markdown: Callable,
  plot: Callable | None = None,
  ignore: tuple[str, ...] = (),
) -> None:
  """`write_files` into `workdir`, then into `publish` when set, unless `publish` holds the record
  `record` of another config (`check_publish`, outside `ignore`): then a ValueError, with nothing
  published and the workdir's copy written."""
  write_files(result, workdir, record, markdown, plot)
  if publish:
    try:  # another config's record there, or a folder that cannot be made
      check_publish(result["config"], publish, record.format(**result), ignore)
      os.makedirs(publish, exist_ok=True)
    except (ValueError, OSError) as e:
      raise ValueError(f"{e}. Nothing was published; this invocation's results are in {workdir}") from None
    write_files(result, publish, record, markdown, plot)


def keep_earlier_report(config: Config, workdir: str, name: str, study: str) -> None:
  """Where `workdir` holds a record `name` of the study `study` of another config (`record.config_differences`,
  outside the other studies' blocks: another method list, another task...), moves every file of its
  top level (the report: its json, markdown and plots; the run cache and the compilation cache are
  folders, shared) into `<workdir>/earlier-<its date>/` and says so: a second benchmark in a workdir
  keeps the first's report beside its own. Nothing where there is nothing to keep (no record, or one of
  this config: a re-run, which replaces it)."""
  earlier = stored(os.path.join(workdir, name))
  lines = config_differences(stored_config(earlier), config, other_studies(study)) if earlier else []
  if not lines:
    return
  stamp = re.sub(r"[^0-9A-Za-z]+", "-", str(earlier.get("date", "undated"))).strip("-")
  folder = os.path.join(workdir, f"earlier-{stamp}")
  os.makedirs(folder, exist_ok=True)
  for entry in sorted(os.listdir(workdir)):
    if os.path.isfile(path := os.path.join(workdir, entry)):
      os.replace(path, os.path.join(folder, entry))
  print(
    f"note: {workdir} held the report of another benchmark ({_shown(lines, 3)}); it is kept in {folder}", flush=True
  )
