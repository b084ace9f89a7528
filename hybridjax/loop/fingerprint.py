"""A run's code fingerprint: what `train()` records of the code it trains with, and how a resume compares it.

`fingerprint` hashes

* the run's **own** code, each callable passed to `train()` apart (`loss_fn`, `train_batch`,
  `init_params`, `tx`) and a method module of the user's (`hybrid.method` naming one), and
* **hybridjax's** code (`codehash.code_hash` of the training loop and what it imports, the method,
  and every hybridjax module a callable above comes from).

A callable is hashed by its code and by the values it holds (`callable_digest`):

* its code, by where it is defined: in a module of the user's that imports from a file, the code of
  that module and of everything it imports (`codehash.code_hash`, as the run cache reads it:
  comments, docstrings and layout aside); in `__main__`, a notebook or any code without a source
  file, its compiled code (the bytecode, constants and names of the function and of every function
  and lambda inside it) and the values of the globals it reads; in hybridjax or an installed
  library, its name (hybridjax's code is hashed once, apart; a library's version is not the run's
  code);
* the values it holds: its closure's cells, its defaults, a `functools.partial`'s arguments, a bound
  method's object, each hashed by value (`value_digest`: numbers, strings, arrays by their bytes,
  containers, dataclasses such as a Flax module by their fields, callables in turn).

So editing a lambda defined in a script (`tx=lambda lr: optax.adam(lr)` made `optax.adam(0.5 * lr)`)
changes its compiled code, and the lambda is named as changed; so does changing a number it closes
over or a global of the script it reads. Editing an unrelated function of the same script does not
(each callable is hashed apart), but editing any function of a module file that a callable comes from
does (the module is the unit, as in the run cache).

`compare` tells the run's own changes (a resume refuses them, unless `resume='force'`) from
hybridjax's (said and recorded, never refused).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from hybridjax import codehash, registry

# An array with more elements than this is hashed by its dtype, shape and this many evenly spaced
# elements: a task's closure may hold a whole token file, read at every `train()` call otherwise.
_FULL_HASH_ELEMENTS = 1 << 20
_SAMPLED_ELEMENTS = 1 << 16
_MAX_DEPTH = 12  # how deep values are followed (a Flax module's parents, an optax chain's closures)

USER_PARTS = ("loss_fn", "train_batch", "init_params", "tx", "method")


def _sha(obj: Any) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _origin(module_name: str | None) -> str:
  """Where code of `module_name` lives: 'script' for __main__, a notebook or no source file;
  'hybridjax', 'library' or 'user' for a module with a source file."""
  path = codehash._module_file(module_name) if module_name not in (None, "", "__main__") else None
  if path is None:
    return "script"
  if module_name.split(".")[0] == "hybridjax":
    return "hybridjax"
  return "library" if codehash._is_library(module_name, path) else "user"


def _code_object(code: types.CodeType) -> list[Any]:
  """A compiled function's code: its bytecode, names and constants, nested functions' code in turn."""
  consts = [_code_object(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
  names = [code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars]
  return [code.co_code.hex(), consts, names]


def _global_names(code: types.CodeType) -> set[str]:
  return set(code.co_names).union(*(_global_names(c) for c in code.co_consts if isinstance(c, types.CodeType)))


class _Digest:
  """Hashes values and callables into JSON-able structures."""

  def __init__(self) -> None:
    self.seen: set[int] = set()  # the objects being hashed, outermost first: a cycle stops there
    self.hybridjax_modules: set[str] = set()

  def value(self, v: Any, depth: int = 0) -> Any:
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
      return repr(v)
    if depth > _MAX_DEPTH:
      return ["deep", type(v).__qualname__]
    if isinstance(v, (np.ndarray, np.generic)) or type(v).__module__.startswith("jax"):  # jax, jaxlib
      if hasattr(v, "shape") and hasattr(v, "dtype"):
        return self.array(v)
    if isinstance(v, types.ModuleType):
      return ["module", v.__name__]
    if isinstance(v, type):
      return ["type", v.__module__, v.__qualname__]
    if id(v) in self.seen:  # a cycle: an object inside itself
      return ["cycle", type(v).__qualname__]
    self.seen.add(id(v))
    try:
      return self._container(v, depth)
    finally:
      self.seen.discard(id(v))

  def _container(self, v: Any, depth: int) -> Any:
    inner = functools.partial(self.value, depth=depth + 1)
    if isinstance(v, (list, tuple)):
      return [type(v).__qualname__, [inner(x) for x in v]]
    if isinstance(v, (set, frozenset)):
      return ["set", sorted(json.dumps(inner(x), default=str) for x in v)]
    if isinstance(v, Mapping):
      items = sorted((repr(k), inner(x)) for k, x in v.items())
      return [type(v).__qualname__, items]
    if callable(v) and not dataclasses.is_dataclass(v):
      return self.callable(v, depth + 1)
    if dataclasses.is_dataclass(v):
      fields = {f.name: inner(getattr(v, f.name, None)) for f in dataclasses.fields(v)}
      return ["dataclass", type(v).__module__, type(v).__qualname__, fields]
    text = repr(v)
    if " at 0x" not in text:
      return ["repr", type(v).__qualname__, text]
    state = getattr(v, "__dict__", None)
    return ["object", type(v).__module__, type(v).__qualname__, inner(state) if state else None]

  @staticmethod
  def array(v: Any) -> list[Any]:
    a = np.asarray(v)
    flat = a.reshape(-1)
    if flat.size > _FULL_HASH_ELEMENTS:
      flat = flat[np.linspace(0, flat.size - 1, _SAMPLED_ELEMENTS).astype(np.int64)]
    return ["array", str(a.dtype), list(a.shape), hashlib.sha256(np.ascontiguousarray(flat).tobytes()).hexdigest()]

  def code_of(self, module_name: str | None, qualname: str, code: types.CodeType | None) -> list[Any]:
    origin = _origin(module_name)
    if origin == "hybridjax":
      self.hybridjax_modules.add(module_name)  # its code is hashed with hybridjax's
    if origin in ("hybridjax", "library"):
      return [origin, module_name, qualname]
    if origin == "user":
      return ["module", module_name, qualname, codehash.code_hash([module_name])]
    compiled = _code_object(code) if code is not None else None
    return ["compiled", qualname, f"python {sys.version_info.major}.{sys.version_info.minor}", compiled]

  def callable(self, f: Any, depth: int = 0) -> Any:
    inner = functools.partial(self.value, depth=depth + 1)
    if isinstance(f, functools.partial):
      return [
        "partial",
        self.callable(f.func, depth + 1),
        inner(f.args),
        inner(f.keywords),
      ]
    if isinstance(f, types.MethodType):
      return ["method", self.callable(f.__func__, depth + 1), inner(f.__self__)]
    if isinstance(f, types.FunctionType):
      code = self.code_of(f.__module__, f.__qualname__, f.__code__)
      cells = [inner(c.cell_contents) if _has_contents(c) else None for c in f.__closure__ or ()]
      defaults = [inner(f.__defaults__), inner(f.__kwdefaults__)]
      # A script's function reads its globals at call time: their values too.
      names = sorted(_global_names(f.__code__)) if code[0] == "compiled" else []
      g = f.__globals__
      read = {n: inner(g[n]) for n in names if n in g and not isinstance(g[n], types.ModuleType)}
      return ["function", code, cells, defaults, read]
    if isinstance(f, types.BuiltinFunctionType):
      return ["builtin", getattr(f, "__module__", None), f.__qualname__]
    # A callable object: its class's code and its state.
    cls = type(f)
    call = vars(cls).get("__call__")
    code = self.code_of(cls.__module__, cls.__qualname__, getattr(call, "__code__", None))
    state = getattr(f, "__dict__", None)
    return ["object", code, inner(state) if state else None]


def _has_contents(cell: types.CellType) -> bool:
  try:
    cell.cell_contents  # noqa: B018 (an empty cell raises)
  except ValueError:
    return False
  return True


def callable_digest(f: Any) -> str:
  """The hash of callable `f`: its code and the values it holds (the module docstring says how)."""
  return _sha(_Digest().value(f))


def fingerprint(
  callables: Mapping[str, Callable[..., Any] | None], method: registry.Method | None, mode: str, loop_module: str
) -> dict[str, Any]:
  """{'own': {part: hash} of the run's own code, 'hybridjax': hash of hybridjax's code}.

  `callables`: `train()`'s `loss_fn`, `train_batch`, `init_params` and `tx` (None: not given, so not
  hashed; the config builds the optimizer then). `method`: the run's method (hybrid mode), hashed as
  the run's own when it is a module of the user's, else with hybridjax's. `loop_module`: the module
  that trains (`train()`'s), whose code and imports are hybridjax's code."""
  digest = _Digest()
  own = {name: _sha(digest.value(f)) for name, f in callables.items() if f is not None}
  modules = [loop_module, *digest.hybridjax_modules]
  if mode == "hybrid" and method is not None:
    if method.path.split(".")[0] == "hybridjax":
      modules.append(method.path)
    else:
      module = sys.modules.get(method.path)
      own["method"] = (
        codehash.code_hash([method.path])
        if _origin(method.path) == "user"
        else _sha(digest.value(vars(module) if module else None))
      )
  return {"own": own, "hybridjax": codehash.code_hash(sorted(set(modules)))}


def compare(saved: Mapping[str, Any] | None, current: Mapping[str, Any]) -> tuple[list[str], bool]:
  """(the parts of the run's own code that differ between `saved` and `current`, in `USER_PARTS`
  order: one given now and not then, or the reverse, counts; whether hybridjax's code differs)."""
  saved = saved or {}
  before, now = saved.get("own", {}), current.get("own", {})
  changed = [p for p in USER_PARTS if before.get(p) != now.get(p)]
  return changed, saved.get("hybridjax") != current.get("hybridjax")


def describe_parts(parts: list[str]) -> str:
  """'loss_fn and tx' for ['loss_fn', 'tx'], each named as the user passed it."""
  names = [f"the method module ({p})" if p == "method" else p for p in parts]
  return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
