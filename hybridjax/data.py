"""Text corpora as uint16 token files, and deterministic batches from them.

The pipeline follows nanoGPT: a corpus (the bundled Shakespeare, a text file or
a folder of text files) is tokenised once into `train.bin` and `val.bin`, flat
uint16 arrays read back as memory maps, plus a `meta.json`. Prepared corpora
are cached in a folder keyed by (content hash, tokenizer, val_fraction), so a
second run with the same data starts at once.

Batches are random windows of the token stream. Their offsets come from
`np.random.default_rng((seed, step))`, so batch `step` is the same whatever
happened before it: a resumed run sees exactly the data it would have seen.

Errors name the config field to change: `data.path`, `data.tokenizer`,
`data.val_fraction`, `trainer.batch_size`, `model.n_ctx`, `model.vocab_size`.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import dataclasses
import functools
import gzip
import hashlib
import importlib.resources
import itertools
import json
import logging
import lzma
import os
import pathlib
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np
import tiktoken

from hybridjax import schema

TOKEN_DTYPE = np.uint16
TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
META_FILE = "meta.json"
BUNDLED_SOURCE = "bundled:shakespeare"
CACHE_ENV = "HYBRIDJAX_CACHE"
TOKENIZERS = ("byte", "gpt2")
ORDERS = ("random", "no_repeat")  # `data.order`: how training batches draw their windows (`get_batch`)
SPLIT_FOLDERS = ("train", "val")  # a corpus folder holding both is its own train / held-out split
# The GPT-2 task's data block (`config.data`), declared once: the experiment config builds it from these,
# the run's pre-flight checks them (`preflight.DECLARED`).
DATA_FIELDS = (
  schema.Field("path", "", schema.check_str, "'' = the bundled Shakespeare corpus; else a text file or folder"),
  schema.Field(
    "tokenizer", "byte", schema.check_choice(*TOKENIZERS), "'byte' (one token per byte) or 'gpt2' (tiktoken's BPE)"
  ),
  schema.Field(
    "cache_dir",
    "",
    schema.check_str,
    "where the tokenized corpus is kept; '' = $HYBRIDJAX_CACHE or ~/.cache/hybridjax/data",
    runtime="host",
  ),
  schema.Field(
    "val_fraction",
    0.1,
    schema.check_num(0.0, 0.5, lo_open=True),
    "the share of the tokens, at the end of the token stream, held out for evaluation (the same for every seed; "
    "unread for a folder with its own train/ and val/ split)",
  ),
  schema.Field(
    "order",
    "random",
    schema.check_choice(*ORDERS),
    "'random': each batch random windows, fixed by (seed, step), a window may repeat; 'no_repeat': a seeded "
    "permutation of the split's non-overlapping windows, none drawn twice (a run needing more is refused)",
  ),
)

# Bump when the layout of prepared files changes, so old caches are not reused.
_FORMAT_VERSION = 1
_READ_BLOCK = 8 << 20  # bytes read from a file at a time.
_CHUNK_CHARS = 1 << 20  # characters tokenised at a time.
_CHUNK_CHARS_MAX = 4 * _CHUNK_CHARS  # hard cap when no safe split is found.
_SNIFF_BYTES = 8 << 10
# A file is rejected as "not text" if more than this share of its bytes is not
# valid UTF-8. Below it, the bad bytes become U+FFFD and a warning is logged.
_MAX_INVALID_UTF8 = 0.01
_EVAL_STREAM = 0xE7A1  # Spawn key of the eval_batches random stream.
_ORDER_STREAM = 0x0DE5  # Spawn key of the no-repeat order's permutation.

# The GPT-2 pre-tokenisation regex, as in tiktoken_ext/openai_public.py.
_GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_GPT2_EOT = "<|endoftext|>"
# Boundaries of the GPT-2 pre-tokeniser whatever the text around them: after a
# newline between two non-space characters, and between a non-space character
# and " X" (X non-space). Text split there tokenises exactly as the whole would.
_SAFE_SPLIT = re.compile(r"\S\n(?=\S)|\S(?= \S)")


# ----------------------------------------------------------------------------
# Tokenizers.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """UTF-8 bytes as tokens: vocab 256, no special tokens."""

  name: str = "byte"
  vocab_size: int = 256
  eot_token: int | None = None

  def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
    """Returns the UTF-8 bytes of `text`. There are no special tokens."""
    del allow_special  # A byte tokenizer has no special tokens.
    return list(text.encode("utf-8"))

  def decode(self, tokens: Sequence[int]) -> str:
    """Decodes bytes to text; invalid UTF-8 becomes U+FFFD."""
    return bytes(tokens).decode("utf-8", errors="replace")

  def encode_to_array(self, texts: Sequence[str]) -> np.ndarray:
    """Encodes `texts` one after the other into one uint16 array."""
    data = b"".join(t.encode("utf-8") for t in texts)
    return np.frombuffer(data, dtype=np.uint8).astype(TOKEN_DTYPE)


class GPT2Tokenizer:
  """GPT-2 BPE through tiktoken, built offline from the bundled rank file."""

  name = "gpt2"
  vocab_size = 50257

  def __init__(self):
    ranks = _load_gpt2_ranks()
    self.eot_token = len(ranks)  # 50256.
    self._enc = tiktoken.Encoding(
      name="gpt2",
      pat_str=_GPT2_PAT_STR,
      mergeable_ranks=ranks,
      special_tokens={_GPT2_EOT: self.eot_token},
    )
    assert self._enc.n_vocab == self.vocab_size, self._enc.n_vocab

  def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
    """Encodes `text`.

    Args:
      text: the text.
      allow_special: if True, "<|endoftext|>" in `text` becomes the single
        token 50256. If False (the default), it is encoded as ordinary text,
        so a corpus can never inject document separators.

    Returns:
      The token ids.
    """
    return self._enc.encode(text, allowed_special="all") if allow_special else self._enc.encode_ordinary(text)

  def decode(self, tokens: Sequence[int]) -> str:
    """Decodes token ids; 50256 decodes to "<|endoftext|>"."""
    return self._enc.decode(list(tokens), errors="replace")

  def encode_to_array(self, texts: Sequence[str]) -> np.ndarray:
    """Encodes `texts` (as ordinary text) one after the other into uint16."""
    encoded = self._enc.encode_ordinary_batch(list(texts), num_threads=2)
    return np.fromiter(
      itertools.chain.from_iterable(encoded),
      dtype=TOKEN_DTYPE,
      count=sum(len(e) for e in encoded),
    )


# What the data pipeline needs of a tokenizer: `name`, `vocab_size`, `eot_token`, `encode`, `decode`
# and `encode_to_array`.
Tokenizer = ByteTokenizer | GPT2Tokenizer


def _asset(name: str) -> Any:
  """Returns a readable handle (Traversable or Path) for a bundled asset."""
  try:
    root = importlib.resources.files("hybridjax")
  except (TypeError, NotADirectoryError, ModuleNotFoundError):
    # Python 3.11 cannot read resources of a namespace package.
    root = pathlib.Path(__file__).resolve().parent
  return root / "assets" / name


def _load_gpt2_ranks() -> dict[bytes, int]:
  """Parses the bundled gzipped `gpt2.tiktoken` ("base64token rank" lines)."""
  with _asset("gpt2.tiktoken.gz").open("rb") as raw, gzip.open(raw) as f:
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in f if line.strip())}


@functools.cache
def get_tokenizer(name: str) -> Tokenizer:
  """Returns the tokenizer called `name`: "byte" or "gpt2" (cached).

  Args:
    name: the tokenizer name, as in `data.tokenizer`.

  Raises:
    ValueError: for an unknown name.
  """
  if name == "byte":
    return ByteTokenizer()
  if name == "gpt2":
    return GPT2Tokenizer()
  raise ValueError(f"unknown tokenizer {name!r}: set data.tokenizer to one of {list(TOKENIZERS)}")


def bundled_corpus_text() -> str:
  """Returns the bundled corpus: Shakespeare's complete works (about 5 MB)."""
  with _open(_Document(BUNDLED_SOURCE, None)) as f:
    return f.read().decode("utf-8")


# ----------------------------------------------------------------------------
# Reading corpora.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Document:
  """One document of a corpus: a file, or the bundled text."""

  name: str  # Path relative to the corpus root, or the bundled source name.
  path: pathlib.Path | None  # None for the bundled corpus.


@contextlib.contextmanager
def _open(doc: _Document) -> Iterator[BinaryIO]:
  """Opens a document for reading its raw (decompressed) bytes."""
  if doc.path is None:
    with _asset("shakespeare.txt.xz").open("rb") as raw, lzma.open(raw) as f:
      yield f  # type: ignore[misc]
  else:
    with open(doc.path, "rb") as f:
      yield f


def _iter_blocks(doc: _Document) -> Iterator[bytes]:
  with _open(doc) as f:
    while block := f.read(_READ_BLOCK):
      yield block


def _iter_text(doc: _Document) -> Iterator[str]:
  """Yields the text of `doc` in blocks; invalid UTF-8 becomes U+FFFD."""
  decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
  for block in _iter_blocks(doc):
    yield decoder.decode(block)
  yield decoder.decode(b"", final=True)


def _looks_like_text(path: pathlib.Path) -> bool:
  """Sniffs the start of a file: no NUL bytes and (almost) valid UTF-8."""
  with open(path, "rb") as f:
    head = f.read(_SNIFF_BYTES)
  if b"\0" in head:
    return False
  # A multi-byte character may be cut at the end of the sniffed block.
  text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head)
  n_bad = text.count("\ufffd") - head.count("\ufffd".encode())
  return n_bad <= _MAX_INVALID_UTF8 * max(len(head), 1)


def split_folders(path: str | None) -> bool:
  """Whether `data.path` is a folder holding `train/` and `val/`: its own train / held-out split (the
  documents of each, files beside them unread), which replaces the tail split of `data.val_fraction`."""
  root = pathlib.Path(path).expanduser() if path else None
  return bool(root and root.is_dir() and all((root / name).is_dir() for name in SPLIT_FOLDERS))


def _list_documents(path: str | None) -> tuple[str, list[_Document]]:
  """Returns (source, documents) for `data.path`; checks it exists."""
  if not path:
    return BUNDLED_SOURCE, [_Document(BUNDLED_SOURCE, None)]
  root = pathlib.Path(path).expanduser()
  if not root.exists():
    raise FileNotFoundError(
      f"data.path {path!r} does not exist: set data.path to a text file, a "
      "folder of text files, or '' for the bundled Shakespeare corpus"
    )
  root = root.resolve()
  if root.is_file():
    return str(root), [_Document(root.name, root)]
  if not root.is_dir():
    raise ValueError(f"data.path {path!r} is neither a file nor a folder")
  docs, skipped = [], []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    for filename in sorted(filenames):
      file = pathlib.Path(dirpath) / filename
      if filename.startswith(".") or not file.is_file() or file.stat().st_size == 0:
        continue
      rel = file.relative_to(root).as_posix()
      if _looks_like_text(file):
        docs.append(_Document(rel, file))
      else:
        skipped.append(rel)
  if skipped:
    logging.warning(
      "data.path %s: skipped %d file(s) that are not text: %s", root, len(skipped), ", ".join(skipped[:10])
    )
  if not docs:
    raise ValueError(
      f"data.path {path!r} is a folder with no non-empty text files "
      f"(skipped as not text: {skipped[:10]}): point data.path at UTF-8 "
      "text"
    )
  return str(root), docs


def _hash_and_check(source: str, docs: Sequence[_Document]) -> str:
  """Returns the content hash of `docs`; raises ValueError if not usable text.

  A document is rejected if it contains a NUL byte or if more than 1% of its
  bytes are not valid UTF-8. Documents that hold only whitespace are allowed
  in a folder, but a corpus with no text at all is an error.
  """
  digest = hashlib.sha256()
  any_text = False
  for doc in docs:
    n_bytes = n_bad = 0
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    digest.update(doc.name.encode() + b"\0")
    for block in _iter_blocks(doc):
      if b"\0" in block:
        raise ValueError(
          f"data.path: {_describe(source, doc)} contains NUL bytes, so it is "
          "not a text file: point data.path at UTF-8 text"
        )
      digest.update(block)
      text = decoder.decode(block)
      n_bytes += len(block)
      n_bad += text.count("\ufffd") - block.count("\ufffd".encode())
      any_text = any_text or bool(text.strip())
    n_bad += decoder.decode(b"", final=True).count("\ufffd")
    digest.update(b"\0%d\0" % n_bytes)
    if n_bad > _MAX_INVALID_UTF8 * n_bytes:
      raise ValueError(
        f"data.path: {_describe(source, doc)} is not UTF-8 text ({n_bad} of "
        f"{n_bytes} bytes are invalid): point data.path at UTF-8 text"
      )
    if n_bad:
      logging.warning("%s: %d invalid UTF-8 bytes replaced by U+FFFD", _describe(source, doc), n_bad)
  if not any_text:
    raise ValueError(
      f"data.path {source!r} is empty (no text to train on): point data.path at a non-empty text file or folder"
    )
  return digest.hexdigest()


def _describe(source: str, doc: _Document) -> str:
  if doc.path is None or source == str(doc.path):
    return repr(source)
  return f"{str(doc.path)!r} (in {source!r})"


def _safe_chunks(texts: Iterable[str]) -> Iterator[str]:
  """Re-cuts a stream of text into chunks of about `_CHUNK_CHARS` characters.

  Chunks end where the GPT-2 pre-tokeniser always splits (`_SAFE_SPLIT`), so
  tokenising the chunks one by one gives the same tokens as tokenising the
  whole text. A stretch of `_CHUNK_CHARS_MAX` characters with no such point
  (e.g. pure whitespace) is cut anyway.
  """
  buffer = ""
  for text in texts:
    buffer += text
    while len(buffer) >= _CHUNK_CHARS:
      match = _SAFE_SPLIT.search(buffer, _CHUNK_CHARS - 2, _CHUNK_CHARS_MAX)
      if match:
        cut = match.end()
      elif len(buffer) < _CHUNK_CHARS_MAX:
        break  # Wait for more text: a safe split may still come.
      else:
        cut = _CHUNK_CHARS_MAX  # No safe split in sight: cut anyway.
      yield buffer[:cut]
      buffer = buffer[cut:]
  if buffer:
    yield buffer


def _iter_token_arrays(docs: Sequence[_Document], tokenizer: Tokenizer) -> Iterator[np.ndarray]:
  """Tokenises `docs` in bounded chunks, with a separator between documents.

  The separator is the tokenizer's end-of-text token if it has one, else a
  blank line ("\\n\\n").
  """
  eot = tokenizer.eot_token
  separator = tokenizer.encode_to_array(["\n\n"]) if eot is None else np.array([eot], dtype=TOKEN_DTYPE)
  batch_size = 8  # Chunks per tokenizer call: bounds memory, feeds threads.
  for i, doc in enumerate(docs):
    if i:
      yield separator
    chunks = _safe_chunks(_iter_text(doc))
    while batch := list(itertools.islice(chunks, batch_size)):
      yield tokenizer.encode_to_array(batch)


# ----------------------------------------------------------------------------
# Preparing and caching token files.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PreparedData:
  """A tokenised corpus on disk.

  Attributes:
    train_path: the uint16 token file of the training split.
    val_path: the uint16 token file of the validation split (the tail).
    vocab_size: the tokenizer's vocabulary size.
    tokenizer: the tokenizer name ("byte" or "gpt2").
    n_train: number of tokens in `train_path`.
    n_val: number of tokens in `val_path`.
    meta: the contents of `meta.json`.
  """

  train_path: str
  val_path: str
  vocab_size: int
  tokenizer: str
  n_train: int
  n_val: int
  meta: dict[str, Any]


def default_cache_dir() -> str:
  """Returns `$HYBRIDJAX_CACHE` if set, else `~/.cache/hybridjax/data`."""
  return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "hybridjax", "data")


def prepare_corpus(
  path: str | None,
  tokenizer_name: str,
  cache_dir: str | None = None,
  val_fraction: float = 0.1,
  *,
  out_dir: str | None = None,
) -> PreparedData:
  """Tokenises a corpus into `train.bin`, `val.bin` and `meta.json`.

  The files go to `<cache_dir>/<key>/`, where the key is built from the
  content hash, the tokenizer and `val_fraction`; an existing complete cache
  entry is reused without tokenising again. Every file is written to a
  temporary name and renamed, and `meta.json` comes last, so an interrupted
  run never leaves files that are later taken as complete.

  Args:
    path: `data.path`: None or "" for the bundled Shakespeare corpus, a text
      file, or a folder. A folder's files are read recursively in sorted
      order; hidden and non-text files are skipped. Documents are joined by
      the tokenizer's end-of-text token, or a blank line for bytes.
    tokenizer_name: `data.tokenizer`: "byte" or "gpt2".
    cache_dir: the cache root; None or "" means `default_cache_dir()`.
    val_fraction: `data.val_fraction`: the share of tokens, at the end of
      the token stream, that forms the validation split; in (0, 0.5].
    out_dir: if set, write the files directly into this folder instead of a
      cache entry (reused the same way if it already holds this corpus).

  Returns:
    The prepared data.

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError: for an unknown tokenizer, a bad `val_fraction`, or a corpus
      that is empty, not text, or too small to split.
  """
  tokenizer = get_tokenizer(tokenizer_name)
  if not 0.0 < val_fraction <= 0.5:
    raise ValueError(f"data.val_fraction must be in (0, 0.5], got {val_fraction}")
  split = split_folders(path)
  if split:
    root = pathlib.Path(str(path)).expanduser().resolve()
    parts = [_list_documents(str(root / name))[1] for name in SPLIT_FOLDERS]
    source = str(root)
    docs = [_Document(f"{name}/{d.name}", d.path) for name, part in zip(SPLIT_FOLDERS, parts) for d in part]
  else:
    source, docs = _list_documents(path)
  content_hash = _hash_and_check(source, docs)
  held_out = "split" if split else f"val{val_fraction!r}"
  key = f"v{_FORMAT_VERSION}-{content_hash[:16]}-{tokenizer.name}-{held_out}"
  dest = pathlib.Path(out_dir or os.path.join(cache_dir or default_cache_dir(), key)).expanduser()

  if (prepared := _load_prepared(dest, key)) is not None:
    logging.info("data: reusing %s", dest)
    return prepared
  logging.info("data: tokenising %s with %s into %s", source, tokenizer.name, dest)
  dest.mkdir(parents=True, exist_ok=True)
  (dest / META_FILE).unlink(missing_ok=True)  # Invalid from here on.
  if split:
    n_train, n_val = _write_folder_splits(dest, [_iter_token_arrays(part, tokenizer) for part in parts], source)
  else:
    n_train, n_val = _write_splits(dest, _iter_token_arrays(docs, tokenizer), val_fraction, source)
  meta = {
    "format_version": _FORMAT_VERSION,
    "key": key,
    "tokenizer": tokenizer.name,
    "vocab_size": tokenizer.vocab_size,
    "eot_token": tokenizer.eot_token,
    "dtype": np.dtype(TOKEN_DTYPE).name,
    "n_tokens": n_train + n_val,
    "n_train": n_train,
    "n_val": n_val,
    "val_fraction": None if split else val_fraction,
    "held_out": "the corpus's val/ folder" if split else "the token stream's tail",
    "source": source,
    "files": [d.name for d in docs],
    "content_hash": content_hash,
  }
  with _replacing(dest / META_FILE) as (tmp,):
    tmp.write_bytes(json.dumps(meta, indent=2).encode())
  return _from_meta(dest, meta)


def _write_splits(
  dest: pathlib.Path,
  token_arrays: Iterable[np.ndarray],
  val_fraction: float,
  source: str,
) -> tuple[int, int]:
  """Streams tokens to disk and splits off the tail as `val.bin`."""
  itemsize = np.dtype(TOKEN_DTYPE).itemsize
  with _replacing(dest / TRAIN_FILE, dest / VAL_FILE) as (train_tmp, val_tmp):
    n_tokens = _write_tokens(train_tmp, token_arrays)
    n_val = int(n_tokens * val_fraction)
    n_train = n_tokens - n_val
    if n_val < 1:
      raise ValueError(
        f"data.path {source!r} has only {n_tokens} tokens: too few for a "
        f"validation split with data.val_fraction={val_fraction}; use a "
        "larger corpus"
      )
    # Copy the tail to val.bin, then cut it off the train file.
    tokens = np.memmap(train_tmp, dtype=TOKEN_DTYPE, mode="r")
    with open(val_tmp, "wb") as f:
      step = _READ_BLOCK // itemsize
      for start in range(n_train, n_tokens, step):
        f.write(tokens[start : min(start + step, n_tokens)].tobytes())
    del tokens
    os.truncate(train_tmp, n_train * itemsize)
  return n_train, n_val


def _write_folder_splits(dest: pathlib.Path, parts: list[Iterable[np.ndarray]], source: str) -> tuple[int, int]:
  """Streams the train/ folder's tokens to `train.bin` and the val/ folder's to `val.bin`."""
  with _replacing(dest / TRAIN_FILE, dest / VAL_FILE) as tmps:
    counts = [_write_tokens(tmp, arrays) for tmp, arrays in zip(tmps, parts)]
    if min(counts) < 1:
      raise ValueError(f"data.path {source!r}: its train/ or val/ folder holds no tokens")
  return counts[0], counts[1]


@contextlib.contextmanager
def _replacing(*paths: pathlib.Path) -> Iterator[list[pathlib.Path]]:
  """Temporary names beside `paths`, unique to this process and call, each renamed to its path when
  the block completes and removed when it raises."""
  tmps = [path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}") for path in paths]
  try:
    yield tmps
    for tmp, path in zip(tmps, paths):
      os.replace(tmp, path)
  finally:
    for tmp in tmps:
      tmp.unlink(missing_ok=True)


def _write_tokens(path: pathlib.Path, token_arrays: Iterable[np.ndarray]) -> int:
  """Streams `token_arrays` to `path` as uint16; returns the number of tokens written."""
  with open(path, "wb") as f:
    for array in token_arrays:
      f.write(array.astype(TOKEN_DTYPE, copy=False).tobytes())
  return path.stat().st_size // np.dtype(TOKEN_DTYPE).itemsize


def _load_prepared(dest: pathlib.Path, key: str) -> PreparedData | None:
  """Returns the prepared data in `dest` if complete and for `key`."""
  try:
    meta = json.loads((dest / META_FILE).read_text())
    itemsize = np.dtype(TOKEN_DTYPE).itemsize
    complete = (
      meta.get("key") == key
      and (dest / TRAIN_FILE).stat().st_size == meta["n_train"] * itemsize
      and (dest / VAL_FILE).stat().st_size == meta["n_val"] * itemsize
    )
  except (OSError, ValueError, KeyError, TypeError):
    return None
  return _from_meta(dest, meta) if complete else None


def _from_meta(dest: pathlib.Path, meta: dict[str, Any]) -> PreparedData:
  return PreparedData(
    str(dest / TRAIN_FILE),
    str(dest / VAL_FILE),
    meta["vocab_size"],
    meta["tokenizer"],
    meta["n_train"],
    meta["n_val"],
    meta,
  )


def load_tokens(path: str | os.PathLike[str]) -> np.memmap:
  """Opens a uint16 token file read-only as a memory map.

  Raises:
    FileNotFoundError: if the file does not exist.
    ValueError: if it is empty or its size is not a whole number of tokens.
  """
  size = os.path.getsize(path)  # Raises FileNotFoundError.
  if size == 0 or size % np.dtype(TOKEN_DTYPE).itemsize:
    raise ValueError(
      f"token file {os.fspath(path)!r} has {size} bytes: not a non-empty "
      "uint16 token file; prepare it again from data.path"
    )
  return np.memmap(path, dtype=TOKEN_DTYPE, mode="r")


def check_vocab(prepared: PreparedData, model_vocab_size: int) -> None:
  """Raises ValueError if the tokenizer's ids do not fit the model.

  Args:
    prepared: the prepared data.
    model_vocab_size: `model.vocab_size`.
  """
  if prepared.vocab_size > model_vocab_size:
    raise ValueError(
      f"data.tokenizer {prepared.tokenizer!r} has {prepared.vocab_size} "
      f"tokens but model.vocab_size is {model_vocab_size}: set "
      f"model.vocab_size >= {prepared.vocab_size} or choose a smaller "
      "data.tokenizer"
    )


def check_seq_len(prepared: PreparedData, seq_len: int) -> None:
  """Raises ValueError if a split is shorter than one sequence (seq_len + 1).

  Args:
    prepared: the prepared data.
    seq_len: the sequence length, `model.n_ctx`.
  """
  for split, n, hint in (
    ("train", prepared.n_train, "a larger corpus (data.path)"),
    ("val", prepared.n_val, "a larger corpus (data.path) or data.val_fraction"),
  ):
    if n < seq_len + 1:
      raise ValueError(
        f"the {split} split of data.path {prepared.meta.get('source')!r} "
        f"has {n} tokens, but one sequence needs model.n_ctx + 1 = "
        f"{seq_len + 1}: use {hint}, or a smaller model.n_ctx"
      )


# ----------------------------------------------------------------------------
# Batches.
# ----------------------------------------------------------------------------


def _check_batch_args(tokens: np.ndarray, batch_size: int, seq_len: int) -> None:
  if np.ndim(tokens) != 1:
    raise ValueError(f"tokens must be 1-D, got shape {np.shape(tokens)}")
  _check_int("trainer.batch_size", batch_size, 1)
  _check_int("model.n_ctx (seq_len)", seq_len, 1)
  if len(tokens) < seq_len + 1:
    raise ValueError(
      f"the token stream has {len(tokens)} tokens, but one sequence needs "
      f"model.n_ctx + 1 = {seq_len + 1}: use a larger corpus (data.path), "
      "a larger data.val_fraction, or a smaller model.n_ctx"
    )


def _check_int(name: str, value: Any, least: int = 0) -> None:
  if not isinstance(value, (int, np.integer)) or value < least:
    raise ValueError(f"{name} must be a {'positive' if least else 'non-negative'} integer, got {value!r}")


def _gather(
  tokens: np.ndarray,
  starts: np.ndarray,
  seq_len: int,
  vocab_size: int | None,
) -> dict[str, np.ndarray]:
  windows = np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)
  if vocab_size is not None and windows.size and windows.max() >= vocab_size:
    # An id outside the embedding table is not an error inside JAX: the
    # lookup silently returns garbage (NaN or a clipped row). Refuse it here.
    source = getattr(tokens, "filename", None)
    source = f"token file {source!r}" if source else "the token stream"
    raise ValueError(
      f"{source} holds token id {int(windows.max())}, but model.vocab_size "
      f"is {vocab_size}: the file was not made with this data.tokenizer, "
      "or it is corrupted; prepare it again from data.path (delete its "
      "cache entry), or raise model.vocab_size"
    )
  return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


def get_batch(
  tokens: np.ndarray,
  *,
  seed: int,
  step: int,
  batch_size: int,
  seq_len: int,
  vocab_size: int | None = None,
) -> dict[str, np.ndarray]:
  """Returns batch `step`: random windows of `tokens`, fixed by (seed, step).

  Args:
    tokens: a 1-D token array, e.g. from `load_tokens`.
    seed: the data seed (a non-negative integer).
    step: the training step (a non-negative integer).
    batch_size: `trainer.batch_size`.
    seq_len: the sequence length, `model.n_ctx`.
    vocab_size: if set (`model.vocab_size`), a batch holding a larger token id
      raises ValueError instead of reaching the model.

  Returns:
    {"inputs", "targets"}: int32 arrays of shape (batch_size, seq_len), with
    `targets[:, t] == inputs[:, t + 1]`, i.e. the next tokens.

  Raises:
    ValueError: for bad sizes, or if `tokens` is shorter than seq_len + 1.
  """
  _check_batch_args(tokens, batch_size, seq_len)
  _check_int("seed", seed)
  _check_int("step", step)
  starts = np.random.default_rng((int(seed), int(step))).integers(0, len(tokens) - seq_len, size=batch_size)
  return _gather(tokens, starts, seq_len, vocab_size)


def no_repeat_windows(n_tokens: int, seq_len: int) -> int:
  """The non-overlapping windows of seq_len + 1 tokens a split of `n_tokens` holds (`data.order='no_repeat'`)."""
  return max(0, n_tokens // (seq_len + 1))


def check_no_repeat(n_tokens: int, seq_len: int, steps: int, batch_size: int) -> None:
  """Refuses a run under `data.order='no_repeat'` that needs more windows than the split holds."""
  have, need = no_repeat_windows(n_tokens, seq_len), int(steps) * int(batch_size)
  if need > have:
    raise ValueError(
      f"--config.data.order='no_repeat': {steps} steps of {batch_size} windows need {need} windows, but the "
      f"training split holds {have} non-overlapping windows of model.n_ctx + 1 = {seq_len + 1} tokens: use a "
      "larger corpus (data.path), fewer steps, or data.order='random'"
    )


def no_repeat_batches(
  tokens: np.ndarray, *, seed: int, batch_size: int, seq_len: int, vocab_size: int | None = None
) -> Callable[[int], dict[str, np.ndarray]]:
  """`data.order='no_repeat'`: batch(step) gives windows step·B to (step + 1)·B of a permutation of the
  split's non-overlapping windows, seeded by `seed` alone, so a batch is a function of (seed, step) and a
  resumed run draws what the uninterrupted one would. No window is drawn twice while steps·B does not
  exceed the windows (`check_no_repeat`); past that a batch raises."""
  _check_batch_args(tokens, batch_size, seq_len)
  n = no_repeat_windows(len(tokens), seq_len)
  order = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(_ORDER_STREAM,))).permutation(n)

  def batch(step: int) -> dict[str, np.ndarray]:
    _check_int("step", step)
    picked = order[int(step) * batch_size : (int(step) + 1) * batch_size]
    if len(picked) < batch_size:
      check_no_repeat(len(tokens), seq_len, int(step) + 1, batch_size)
    return _gather(tokens, picked.astype(np.int64) * (seq_len + 1), seq_len, vocab_size)

  return batch


def eval_batches(
  tokens: np.ndarray,
  *,
  batch_size: int,
  seq_len: int,
  n_batches: int,
  vocab_size: int | None = None,
) -> list[dict[str, np.ndarray]]:
  """Returns a fixed set of evaluation batches, the same for every run.

  The n_batches * batch_size windows are stratified: the valid offsets are
  cut into that many equal strata and one offset is drawn from each, so the
  batches cover the whole split evenly.

  Args:
    tokens: a 1-D token array, usually the validation split.
    batch_size: `trainer.batch_size`.
    seq_len: the sequence length, `model.n_ctx`.
    n_batches: how many batches.
    vocab_size: if set, a token id >= vocab_size raises ValueError.

  Returns:
    A list of `n_batches` batches, shaped like those of `get_batch`.
  """
  _check_batch_args(tokens, batch_size, seq_len)
  if n_batches < 1:
    raise ValueError(f"trainer.eval_batches (n_batches) must be positive, got {n_batches}")
  n_windows = n_batches * batch_size
  n_starts = len(tokens) - seq_len  # Valid offsets: [0, n_starts).
  edges = np.linspace(0, n_starts, n_windows + 1)
  # A stream of its own: it never coincides with a get_batch (seed, step).
  rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(_EVAL_STREAM,)))
  starts = np.floor(edges[:-1] + rng.random(n_windows) * np.diff(edges))
  starts = np.clip(starts.astype(np.int64), 0, n_starts - 1)
  return [_gather(tokens, s, seq_len, vocab_size) for s in starts.reshape(n_batches, batch_size)]
