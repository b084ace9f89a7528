"""Config fields declared once: a field's name, default, check, one-line doc, and what reads it.

A block of the config (`optim`, `trainer`, ...) is a tuple of `Field`s declared beside the code that
reads them; its default `ConfigDict`, its validation, its generated documentation (docs/config.md)
and the refusal of a field that is set but not read are all derived from those declarations, so no
table restates them. A check is a function from a value to None (fine) or what is wrong with it
("must be >= 1, got 0"), which the caller prefixes with the field's name (`check_*` build them).

This module imports nothing of the package: the optimizers, the methods and the config build on it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_collections

Check = Callable[[Any], "str | None"]


def is_int(v: Any) -> bool:
  """An int that is not a bool."""
  return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
  """A finite int or float that is not a bool."""
  return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def check_int(lo: int | None = None, hi: int | None = None) -> Check:
  """An integer in [lo, hi] (either bound optional)."""

  def check(v):
    if not is_int(v):
      return f"must be an integer, got {v!r}"
    if lo is not None and v < lo:
      return f"must be >= {lo}, got {v}"
    if hi is not None and v > hi:
      return f"must be <= {hi}, got {v}"
    return None

  return check


def check_num(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> Check:
  """A finite number between lo and hi, each bound closed unless `*_open`."""

  def check(v):
    if not is_num(v):
      return f"must be a finite number, got {v!r}"
    if lo is not None and (v <= lo if lo_open else v < lo):
      return f"must be {'>' if lo_open else '>='} {lo}, got {v}"
    if hi is not None and (v >= hi if hi_open else v > hi):
      return f"must be {'<' if hi_open else '<='} {hi}, got {v}"
    return None

  return check


def check_int_tuple(lo: int) -> Check:
  """A non-empty tuple of integers >= lo."""

  def check(v):
    if not isinstance(v, (tuple, list)) or not v or not all(is_int(x) for x in v):
      return f"must be a non-empty tuple of integers, e.g. (50, 100, 200), got {v!r}"
    if min(v) < lo:
      return f"must hold integers >= {lo}, got {v!r}"
    return None

  return check


def check_num_tuple(lo: float) -> Check:
  """A non-empty tuple of numbers > lo."""

  def check(v):
    if not isinstance(v, (tuple, list)) or not v or not all(is_num(x) for x in v):
      return f"must be a non-empty tuple of numbers, e.g. (0.5, 1.0), got {v!r}"
    if min(v) <= lo:
      return f"must hold numbers > {lo}, got {v!r}"
    return None

  return check


def check_choice(*options: str) -> Check:
  """One of `options`."""

  def check(v):
    return None if v in options else f"must be one of {list(options)}, got {v!r}"

  return check


def check_bool(v: Any) -> str | None:
  """True or False."""
  return None if isinstance(v, bool) else f"must be True or False, got {v!r}"


def check_str(v: Any) -> str | None:
  """Any string."""
  return None if isinstance(v, str) else f"must be a string, got {v!r}"


def check_name(v: Any) -> str | None:
  """A non-empty string."""
  return None if isinstance(v, str) and v.strip() else f"must be a non-empty name, got {v!r}"


Unread = Callable[[Any], "str | None"]
"""(the whole config) -> None when the run reads the field, else why it does not ("...turns it off")."""


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field, declared once beside the code that reads it.

  Attributes:
    name: the key in its block (`learning_rate` of `optim`).
    default: its value in the block's defaults.
    check: what a valid value is (`check_*`).
    doc: one line for docs/config.md.
    other: a valid value other than the default; the tests set it to see that what reads the field
      reacts to it (so that a declaration that a field is read cannot drift from the code).
    roles: what the field sets, in words shared with the fields that set the same under another
      owner (`b1` and `groups_b1` share 'beta1'): where an owner does not read a field, the fields it
      reads with a common role are named as the fix.
    unread: for a field read only in some runs (a decay fraction only by the 'wsd' schedule), why a
      config's run does not read it, with the fix; None when always read by its owner.
    in_your_optimizer: for an optimizer field, where its setting goes in an optimizer of the user's
      (`train(tx=...)`), as a format string of the field's value.
    runtime: '' for a field that changes what a run trains; 'resume' for one that a resume may
      change (how long and how often: the length, logging, evals, checkpoints, when a run stops)
      but that a benchmark record compares, since it changes what the record measured; 'host' for
      where and how a run executes (the compile cache, the mesh, progress bars), which never
      changes a figure.
  """

  name: str
  default: Any
  check: Check
  doc: str
  other: Any = None
  roles: tuple[str, ...] = ()
  unread: Unread | None = None
  in_your_optimizer: str = ""
  runtime: str = ""


def by_name(fields: Iterable[Field]) -> dict[str, Field]:
  """{name: field}, refusing a name declared twice."""
  out: dict[str, Field] = {}
  for f in fields:
    if f.name in out:
      raise ValueError(f"config field {f.name!r} is declared twice")
    out[f.name] = f
  return out


def block(fields: Iterable[Field]) -> ml_collections.ConfigDict:
  """A block's defaults, as a ConfigDict whose keys are the declared fields (dotted names nest)."""
  c = ml_collections.ConfigDict()
  for f in by_name(fields).values():
    set_leaf(c, f.name, f.default)
  return c


def set_leaf(config: ml_collections.ConfigDict, name: str, value: Any) -> None:
  """Sets the field of dotted `name` of `config` to `value`, adding the blocks above it that it lacks."""
  *parents, leaf = name.split(".")
  for p in parents:
    if p not in config:
      config[p] = ml_collections.ConfigDict()
    config = config[p]
  config[leaf] = value


def errors(prefix: str, fields: Iterable[Field], values: Mapping[str, Any]) -> list[str]:
  """A line for each declared field of `values` (a block by dotted name; `prefix` '' for the top
  level) whose value its check refuses, or that is missing, as `--config.<prefix>.<name> <what is wrong>`."""
  out = []
  for f in fields:
    flag = f"--config.{prefix}.{f.name}" if prefix else f"--config.{f.name}"
    msg = f.check(values[f.name]) if f.name in values else "is missing from the config"
    if msg:
      out.append(f"{flag} {msg}")
  return out


def raise_invalid(errors: list[str]) -> None:
  """Refuses a config with `errors` (each names a field and the fix), all at once; nothing when none."""
  if errors:
    raise ValueError("invalid config:\n  " + "\n  ".join(errors))


class View:
  """A read-only view of a config block that holds only the declared `fields`: the builder of an
  optimizer gets one, so that reading a field it did not declare fails at once (in the first test
  that builds it) instead of drifting from its declaration. A field missing from the block (one
  written before the field existed) reads as its declared default."""

  def __init__(self, values: Any, fields: Iterable[Field], owner: str):
    self._fields = by_name(fields)
    self._values = values
    self._owner = owner

  def __getattr__(self, name: str) -> Any:
    if name.startswith("_"):
      raise AttributeError(name)
    return self[name]

  def __getitem__(self, name: str) -> Any:
    field = self._fields.get(name)
    if field is None:
      raise AttributeError(
        f"{self._owner} reads config field {name!r}, which it does not declare: add it to its fields "
        f"(declared: {sorted(self._fields)})"
      )
    return self._values.get(name, field.default) if hasattr(self._values, "get") else self._values[name]

  def __contains__(self, name: str) -> bool:
    """Whether the block holds declared field `name` (one written before it existed does not)."""
    return name in self._fields and name in self._values

  def get(self, name: str, default: Any = None) -> Any:
    """The field's value (`default` is ignored: a declared field always has one)."""
    del default
    return self[name]
