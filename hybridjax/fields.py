"""Checks of config values: each `check_*` returns a check, a function from a value to None (fine) or
what is wrong with it ("must be >= 1, got 0"), which the caller prefixes with the field's name.

`config` validates its own blocks with them, and a method's `FIELDS` (hybridjax/methods/__init__.py)
declares its block's checks with them. This module imports nothing of the package, so a method
needs no import of `config` (which loads the methods by name).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], "str | None"]


def is_int(v: Any) -> bool:
  """An int that is not a bool."""
  return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
  """A finite int or float that is not a bool."""
  return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def check_int(lo: int | None = None, hi: int | None = None) -> Callable[[Any], str | None]:
  def check(v):
    if not is_int(v):
      return f"must be an integer, got {v!r}"
    if lo is not None and v < lo:
      return f"must be >= {lo}, got {v}"
    if hi is not None and v > hi:
      return f"must be <= {hi}, got {v}"
    return None

  return check


def check_num(
  lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False
) -> Callable[[Any], str | None]:
  def check(v):
    if not is_num(v):
      return f"must be a finite number, got {v!r}"
    if lo is not None and (v <= lo if lo_open else v < lo):
      return f"must be {'>' if lo_open else '>='} {lo}, got {v}"
    if hi is not None and (v >= hi if hi_open else v > hi):
      return f"must be {'<' if hi_open else '<='} {hi}, got {v}"
    return None

  return check


def check_int_tuple(lo: int) -> Callable[[Any], str | None]:
  def check(v):
    if not isinstance(v, (tuple, list)) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
      return f"must be a non-empty tuple of integers, e.g. (50, 100, 200), got {v!r}"
    if min(v) < lo:
      return f"must hold integers >= {lo}, got {v!r}"
    return None

  return check


def check_num_tuple(lo: float) -> Callable[[Any], str | None]:
  def check(v):
    if not isinstance(v, (tuple, list)) or not v or not all(is_num(x) for x in v):
      return f"must be a non-empty tuple of numbers, e.g. (0.5, 1.0), got {v!r}"
    if min(v) <= lo:
      return f"must hold numbers > {lo}, got {v!r}"
    return None

  return check


def check_choice(*options: str) -> Callable[[Any], str | None]:
  def check(v):
    return None if v in options else f"must be one of {list(options)}, got {v!r}"

  return check


def check_bool(v: Any) -> str | None:
  return None if isinstance(v, bool) else f"must be True or False, got {v!r}"


def check_str(v: Any) -> str | None:
  return None if isinstance(v, str) else f"must be a string, got {v!r}"


def check_name(v: Any) -> str | None:
  if not isinstance(v, str) or not v.strip():
    return f"must be a non-empty name, got {v!r}"
  return None
