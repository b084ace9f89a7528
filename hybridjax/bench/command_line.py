"""The benchmark's arms on the command line: the config file's `prepare_overrides` hook
(experiments/configs/benchmark.py), which `hybridjax.cli` calls before it applies the `--config.*`
overrides, so that `--config.benchmark.arms.<name>.method=...` defines an arm and
`--config.benchmark.arms.<name>.overrides.hybrid.jump.every=50` sets a field of its run config."""

from __future__ import annotations

import difflib

from hybridjax import cli, registry
from hybridjax import config as config_lib
from hybridjax.bench import arms as arms_lib
from hybridjax.bench.studies import Config

ARM_KEYS = ("method", "mode", "control", "control_of", "overrides")  # an entry of `benchmark.arms`


def prepare_overrides(config: Config, argv: list[str]) -> dict[str, str]:
  """Makes `config` ready for `argv`'s overrides of `benchmark.arms`: the entries the command line
  defines, their control arms (`_add_control_arm`), and the fields of an arm's run config its
  overrides set, at their values there (so the command line's value is parsed as that field's type).
  Returns {path: error} for each `benchmark.arms.*` path of `argv` that is no field of its arm, the
  "did you mean" searched within that arm's own fields (`cli.prepare_for_overrides` raises them)."""
  arms = config.get("benchmark", {}).get("arms")
  if arms is None:
    return {}
  made, errors = [], {}
  for path in cli.command_line_fields(argv):
    parts = path.split(".")
    if parts[0] == "hybrid" and len(parts) > 2 and parts[1] not in config.get("hybrid", {}):
      # the benchmark refuses --config.hybrid.method: a method's fields are an arm's overrides
      nearest = difflib.get_close_matches(path, sorted(config_lib.flatten(config)), n=1, cutoff=0.6)
      hint = f"did you mean --config.{nearest[0]}? " if nearest else ""
      errors[path] = (
        f"--config.{path} is not a field of the config: {hint}"
        f"(an arm's: --config.benchmark.arms.<arm>.overrides.{path})"
      )
    if parts[:2] != ["benchmark", "arms"] or len(parts) < 4:
      continue
    name, field = parts[2], ".".join(parts[3:])
    if name not in arms:
      arms[name] = Config({"method": "", "mode": "hybrid", "control": False, "control_of": ""})
      made.append(name)
    if parts[3] == "overrides" and len(parts) > 4:
      own, sub = _run_fields(config, argv, name), field.removeprefix("overrides.")
      if sub in own:
        _add_override(arms[name], sub, own[sub])
        continue
      candidates = ["overrides." + f for f in own]
    elif parts[3] in ARM_KEYS and len(parts) == 4:
      continue
    else:
      candidates = ARM_KEYS
    nearest = difflib.get_close_matches(field, candidates, n=1, cutoff=0.6)
    hint = f"did you mean --config.benchmark.arms.{name}.{nearest[0]}? " if nearest else ""
    errors[path] = (
      f"--config.{path} is not a field of arm {name!r}: {hint}an arm has {', '.join(ARM_KEYS)}, and its overrides "
      "are fields of its run config (the experiment config with the arm's method and its block)"
    )
  for name in made:
    _add_control_arm(arms, argv, name)
  return errors


def _run_fields(config: Config, argv: list[str], arm: str) -> dict:
  """{dotted field: value} of arm `arm`'s run config (`arms.run_config`); empty for a method that does
  not load (`arms.check` names it)."""
  method = cli.override_value(argv, f"benchmark.arms.{arm}.method") or config.benchmark.arms[arm].get("method", "")
  try:
    return config_lib.flatten(arms_lib.run_config(config, arms_lib.Arm(name=arm, method=method)))
  except ValueError:
    return {}


def _add_override(entry: Config, field: str, value: object) -> None:
  """Makes `field` (dotted) of the arm `entry`'s overrides a field the flags can set, at `value`."""
  node = entry.overrides = entry.get("overrides") or Config()
  *parents, leaf = field.split(".")
  for part in parents:
    if part not in node:
      node[part] = Config()
    node = node[part]
  if leaf not in node:
    node[leaf] = value


def _add_control_arm(arms: Config, argv: list[str], name: str) -> None:
  """For arm `name` made on the command line, its control arm `<name>_control` from its method's
  `CONTROL`, as a method named in `benchmark.methods` gets one (`arms.arms`), unless the command
  line makes a control of it itself or the method declares none; it runs with its arm (`arms.selected`)
  and takes its arm's overrides."""
  method = cli.override_value(argv, f"benchmark.arms.{name}.method")
  control = f"{name}_control"
  if not method or control in arms or cli.override_value(argv, f"benchmark.arms.{name}.control") in ("True", "true"):
    return
  for path in cli.command_line_fields(argv):
    if path.startswith("benchmark.arms.") and path.endswith(".control_of") and cli.override_value(argv, path) == name:
      return  # the command line makes a control of it itself
  try:
    declares = bool(arms_lib.declared(registry.load_method(method), "CONTROL"))
  except ValueError:
    return  # the arms' check names a method that does not load
  if declares:
    mode = cli.override_value(argv, f"benchmark.arms.{name}.mode") or "hybrid"
    arms[control] = Config({"method": method, "mode": mode, "control": True, "control_of": name})
