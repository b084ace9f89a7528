"""The code a hash reads: of a file, its code, not its text (`code_lines`: the `tokenize` tokens of its
logical lines, each with its indentation depth, without comments, blank lines, layout, the encoding
declaration and docstrings, found with `ast`; built from the tokens' source text, so the same on every
supported Python); of a set of modules, `code_version`: the code of each and of everything it imports,
transitively (read with `ast`), each module named by its content, not its place, so a pure move keeps
every hash; of the libraries, their versions. The run cache's keys (`hybridjax.bench.runs.keys`) are
built on it (docs/design.md, "The run cache's keys"). This module imports nothing of the package.
"""

from __future__ import annotations

import ast
import bisect
import collections
import functools
import hashlib
import importlib.util
import io
import json
import os
import pathlib
import sys
import sysconfig
import tokenize
from collections.abc import Sequence
from importlib import metadata
from typing import Any

# The distributions below the code whose versions enter every key (their files are not hashed),
# besides those the code imports directly: jaxlib, XLA's, is imported by jax alone.
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_collections")

_Pos = tuple[int, int]  # (line, column in characters), as `tokenize` gives them
# The tokens that are no part of the code: a comment, a line break inside a statement or after a
# blank line or a comment, the encoding (the decoded text is read), the end of the file.
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
# Since 3.12 an f-string is a run of tokens (3.14 adds t-strings): read as its source text, the one
# token it is on 3.11.
_STRING_STARTS = {getattr(tokenize, n) for n in ("FSTRING_START", "TSTRING_START") if hasattr(tokenize, n)}
_STRING_ENDS = {getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, n)}


def _source_text(data: bytes) -> str:
  """A file's text as Python reads it: decoded by its encoding declaration or BOM (UTF-8 without
  either), with universal newlines."""
  encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
  return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def _char_pos(lines: list[str], line: int, byte_col: int) -> _Pos:
  """An `ast` position (its column counts UTF-8 bytes) as a `tokenize` one (its column counts characters)."""
  return line, len(lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8"))


def _slice(lines: list[str], start: _Pos, end: _Pos) -> str:
  """The source text from `start` to `end`."""
  text = "\n".join(lines[start[0] - 1 : end[0]])  # the lines it spans, whole
  return text[start[1] : len(text) - len(lines[end[0] - 1]) + end[1]]


def _is_docstring(body: list[ast.stmt]) -> bool:
  first = body[0] if body else None
  return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


# A logical line: its indentation depth and its items, each a token's text or, for an import
# statement, its index in the file's imports.
_Line = tuple[int, tuple[str | int, ...]]


@functools.lru_cache(maxsize=4096)
def read_code(
  data: bytes,
) -> tuple[tuple[_Line, ...], tuple[tuple[ast.Import | ast.ImportFrom, tuple[str, ...]], ...]]:
  """A file's code (`code_lines`), each import statement standing as one item: the index of its
  (node, tokens) in the second element. Cached by content: every run key reads every file."""
  text = _source_text(data)
  lines = text.split("\n")
  tree = ast.parse(text)
  spans: list[tuple[_Pos, _Pos, int | None]] = []  # (start, end, import index or None: a docstring)
  nodes: list[ast.Import | ast.ImportFrom] = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and _is_docstring(
      node.body
    ):
      span, k = node.body[0], None
    elif isinstance(node, ast.Import | ast.ImportFrom):
      span, k = node, len(nodes)
      nodes.append(node)
    else:
      continue
    start, end = _char_pos(lines, span.lineno, span.col_offset), _char_pos(lines, span.end_lineno, span.end_col_offset)
    spans.append((start, end, k))
  spans.sort(key=lambda s: s[0])
  starts = [s[0] for s in spans]

  out: list[_Line] = []
  depth, items, line_depth = 0, [], 0
  import_tokens: list[list[str]] = [[] for _ in nodes]
  nested, string_start = 0, (0, 0)
  for tok in tokenize.generate_tokens(io.StringIO(text).readline):
    if nested:  # inside an f-string: only its end matters
      nested += (tok.type in _STRING_STARTS) - (tok.type in _STRING_ENDS)
      if not nested:
        items.append(_slice(lines, string_start, tok.end))
      continue
    if tok.type in _NOT_CODE:
      continue
    if tok.type == tokenize.INDENT:
      depth += 1
      continue
    if tok.type == tokenize.DEDENT:
      depth -= 1
      continue
    if tok.type == tokenize.NEWLINE:  # the end of a logical line
      if items:
        out.append((line_depth, tuple(items)))
      items = []
      continue
    if not items:
      line_depth = depth
    i = bisect.bisect_right(starts, tok.start) - 1
    if i >= 0 and tok.start < spans[i][1]:  # in a docstring (dropped) or an import (one item)
      k = spans[i][2]
      if k is not None:
        items += [k] if tok.start == spans[i][0] else []
        import_tokens[k].append(tok.string)
      continue
    if tok.type in _STRING_STARTS:
      nested, string_start = 1, tok.start
      continue
    items.append(tok.string)
  if items:
    out.append((line_depth, tuple(items)))
  return tuple(out), tuple((node, tuple(t)) for node, t in zip(nodes, import_tokens))


def code_lines(source: bytes | str) -> list[tuple[int, tuple[str, ...]]]:
  """A Python file's code as the key reads it: its logical lines, each (indentation depth, its
  tokens' text), without comments, blank lines, layout and docstrings. (The key reads its import
  statements as what they bind: `_bindings`.)"""
  data = source.encode("utf-8") if isinstance(source, str) else source
  lines, imports = read_code(data)
  return [(d, tuple(t for x in items for t in (imports[x][1] if isinstance(x, int) else (x,)))) for d, items in lines]


def _module_file(name: str) -> str | None:
  """The source file of module `name`, or None when it is not a plain source file."""
  try:
    spec = importlib.util.find_spec(name)
  except (ImportError, ValueError):
    return None
  origin = getattr(spec, "origin", None)
  return origin if origin and origin.endswith(".py") else None


def _is_library(name: str, path: str) -> bool:
  """A module of the standard library or of an installed distribution (versioned, not hashed). The
  package itself is always hashed, even when installed."""
  if name.split(".")[0] == "hybridjax":
    return False
  roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
  return any(os.path.abspath(path).startswith(os.path.abspath(r) + os.sep) for r in roots)


def _package_of(module: str, path: str) -> str:
  """The package a relative import in `module` (file `path`) starts from."""
  return module if os.path.basename(path) == "__init__.py" else module.rpartition(".")[0]


def _absolute(node: ast.ImportFrom, package: str) -> str:
  """The absolute module name a `from ... import` statement reads from."""
  base = node.module or ""
  if not node.level:
    return base
  parts = package.split(".")
  return ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))


def _imports(path: str, module: str) -> set[str]:
  """Every module `path` (module `module`) imports, at any depth, as absolute names."""
  package = _package_of(module, path)
  tree = ast.parse(pathlib.Path(path).read_text(encoding="utf-8"))
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = _absolute(node, package)
      found.add(base)
      found.update(f"{base}.{a.name}" for a in node.names)
  return found


def _closure(module: str) -> tuple[dict[str, str], tuple[str, ...]]:
  """({name: source file} of `module` and of every non-library module it imports, transitively; the
  top-level names of the installed, non-standard modules those import directly)."""
  return _closure_on_path(module, tuple(sys.path))  # where a name's file is depends on sys.path


@functools.cache
def _closure_on_path(module: str, path: tuple[str, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
  del path  # the cache's key
  seen: dict[str, str] = {}
  libraries: set[str] = set()
  todo = [module]
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    path = _module_file(name)
    if path is None or _is_library(name, path):
      seen[name] = ""
      top = name.split(".")[0]
      if path is not None and top not in sys.stdlib_module_names:
        libraries.add(top)
      continue
    seen[name] = path
    # A package's __init__ runs before any of its modules.
    parent = name.rpartition(".")[0]
    todo += [parent] if parent else []
    todo += sorted(_imports(path, name))
  return {n: p for n, p in sorted(seen.items()) if p}, tuple(sorted(libraries))


def source_closure(module: str) -> tuple[str, ...]:
  """The source files of `module` and of every non-library module it imports, transitively."""
  return tuple(sorted(set(_closure(module)[0].values())))


def _bindings(
  node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, str]
) -> tuple[list[list[str | None]], list[str]]:
  """What an import statement binds, without the paths of the closure's modules: each binding
  (a module of the closure: ['module', bound name]; an attribute of one: ['attribute', its name,
  bound name]; a library's: its names as written; `import a.b` binding `a`: its dotted path as
  written), and the closure's modules it names, in order (each binding's, the dotted path's every
  prefix)."""
  out: list[list[str | None]] = []
  refs: list[str] = []
  if isinstance(node, ast.Import):
    for a in node.names:
      if a.name in modules and (a.asname or "." not in a.name):
        out.append(["module", a.asname or a.name])
        refs.append(a.name)
      else:  # a library's, or `import a.b`, which binds `a`: its code names the path
        out.append(["import", a.name, a.asname])
        parts = a.name.split(".")
        refs += [m for k in range(len(parts)) if (m := ".".join(parts[: k + 1])) in modules]
    return out, refs
  base = _absolute(node, package)
  for a in node.names:
    if f"{base}.{a.name}" in modules:
      out.append(["module", a.asname or a.name])
      refs.append(f"{base}.{a.name}")
    elif base in modules:
      out.append(["attribute", a.name, a.asname or a.name])
      refs.append(base)
    else:
      out.append(["from", base, a.name, a.asname])
  return out, refs


def _sha(*parts: str) -> str:
  return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


# The hash standing for a module of the closure with no code: all such modules are alike.
_NO_CODE = "no code"


@functools.lru_cache(maxsize=64)
def _module_hashes(files: tuple[tuple[str, str, bytes], ...]) -> dict[str, str]:
  """{name: content address} of each module of the closure (`files`: (name, path, content)) that
  has code: its code with its imports read as what they bind (`_bindings`), refined by the
  addresses of the modules it imports until they tell apart every module they can (colour
  refinement); modules alike all the way down are then told apart by their names. Cached by
  content: a benchmark keys each of its runs."""
  modules = {name: path for name, path, _ in files}
  code: dict[str, str] = {}
  imported: dict[str, list[str]] = {}
  for name, path, data in files:
    lines, imports = read_code(data)
    if not lines:
      continue
    package = _package_of(name, path)
    pairs = [_bindings(node, package, modules) for node, _ in imports]  # (bindings, modules named)
    code[name] = _sha(
      json.dumps([[d, [pairs[x][0] if isinstance(x, int) else x for x in items]] for d, items in lines])
    )
    imported[name] = [r for _, refs in pairs for r in refs]

  def refine(colour: dict[str, str]) -> dict[str, str]:
    # Each round: a module's address, and those of the modules it imports, in its order.
    while True:
      new = {n: _sha(c, *(colour.get(r, _NO_CODE) for r in imported[n])) for n, c in colour.items()}
      if len(set(new.values())) == len(set(colour.values())):
        return new
      colour = new

  colour = refine(code)
  alike = collections.Counter(colour.values())
  if any(n > 1 for n in alike.values()):
    colour = refine({n: _sha(c, n) if alike[c] > 1 else c for n, c in colour.items()})
  return colour


@functools.cache
def _providers() -> dict[str, list[str]]:
  """Which installed distributions provide each top-level module. Reading it walks every installed
  distribution's file list (about half a second), so a process reads it once: every run key needs it."""
  return metadata.packages_distributions()


def _distributions(modules: Sequence[str]) -> list[str]:
  """The installed distributions whose versions enter the key: `LIBRARIES`, and those providing
  the top-level modules the code of `modules` imports."""
  providers = _providers()
  names = set(LIBRARIES)
  for m in modules:
    for top in _closure(m)[1]:
      names.update(providers.get(top, ()))
  return sorted(names, key=str.lower)


def installed_versions(distributions: Sequence[str]) -> dict[str, str]:
  """The installed version of each distribution ('absent' where it is not installed)."""
  versions = {}
  for lib in distributions:
    try:
      versions[lib] = metadata.version(lib)
    except metadata.PackageNotFoundError:
      versions[lib] = "absent"
  return versions


def library_versions(modules: Sequence[str]) -> dict[str, str]:
  """The version of each installed distribution whose version enters the key ('absent' if none)."""
  return installed_versions(_distributions(modules))


def _code_digest(modules: Sequence[str]) -> Any:
  """The sha256 object fed with the code of `modules` and of everything they import (`code_hash`)."""
  closure = {name: path for m in modules for name, path in _closure(m)[0].items()}
  files = tuple((name, path, pathlib.Path(path).read_bytes()) for name, path in sorted(closure.items()))
  addresses = _module_hashes(files)
  h = hashlib.sha256()
  for address in sorted(addresses.values()):
    h.update(address.encode())
  # Which modules are the run's entry points (the task's, the method's: loaded by name).
  for root in sorted({addresses.get(m, _NO_CODE) if m in closure else f"library {m}" for m in modules}):
    h.update(f"root {root}".encode())
  return h


def code_hash(modules: Sequence[str]) -> str:
  """A hash of the code of `modules` and of everything they import, without docstrings, comments,
  layout, file names or paths (this module's docstring says what it keeps); the libraries' versions
  do not enter it (`code_version` adds them)."""
  return _code_digest(modules).hexdigest()[:16]


def code_version(modules: Sequence[str]) -> str:
  """`code_hash` of `modules` with the libraries' versions: what the run cache's keys hold."""
  h = _code_digest(modules)
  for lib, version in library_versions(modules).items():
    h.update(f"{lib} {version}".encode())
  return h.hexdigest()[:16]
