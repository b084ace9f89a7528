"""The checks of config values (`hybridjax.schema`'s), under the name a method's `FIELDS` imports
them by (docs/methods.md): each `check_*` returns a function from a value to None (fine) or what is
wrong with it, which the caller prefixes with the field's name."""

from hybridjax.schema import (
  Check,
  check_bool,
  check_choice,
  check_int,
  check_int_tuple,
  check_name,
  check_num,
  check_num_tuple,
  check_str,
  is_int,
  is_num,
)

__all__ = [
  "Check",
  "check_bool",
  "check_choice",
  "check_int",
  "check_int_tuple",
  "check_name",
  "check_num",
  "check_num_tuple",
  "check_str",
  "is_int",
  "is_num",
]
