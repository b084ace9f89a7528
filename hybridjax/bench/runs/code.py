"""What of a file the run keys hash: its code, not its text (`code_lines`): the `tokenize` tokens
of its logical lines, each with its indentation depth, without comments, blank lines, layout, the
encoding declaration and docstrings (found with `ast`); built from the tokens' source text, so the
same on every supported Python (docs/design.md, "The run cache's keys")."""

from __future__ import annotations

import ast
import bisect
import functools
import io
import tokenize

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
  if start[0] == end[0]:
    return lines[start[0] - 1][start[1] : end[1]]
  middle = lines[start[0] : end[0] - 1]
  return "\n".join([lines[start[0] - 1][start[1] :], *middle, lines[end[0] - 1][: end[1]]])


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
      doc = node.body[0]
      spans.append(
        (_char_pos(lines, doc.lineno, doc.col_offset), _char_pos(lines, doc.end_lineno, doc.end_col_offset), None)
      )
    elif isinstance(node, ast.Import | ast.ImportFrom):
      start = _char_pos(lines, node.lineno, node.col_offset)
      end = _char_pos(lines, node.end_lineno, node.end_col_offset)
      spans.append((start, end, len(nodes)))
      nodes.append(node)
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
  statements as what they bind: `keys._bindings`.)"""
  data = source.encode("utf-8") if isinstance(source, str) else source
  lines, imports = read_code(data)
  return [(d, tuple(t for x in items for t in (imports[x][1] if isinstance(x, int) else (x,)))) for d, items in lines]
