"""Tests for hybridjax.data: tokenizers, token files, batches and errors."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import chex
import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from hybridjax import data

_REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
  """Keeps every cache write out of the user's home."""
  monkeypatch.setenv(data.CACHE_ENV, str(tmp_path / "env_cache"))


@pytest.fixture(scope="module")
def bundled_byte(tmp_path_factory) -> data.PreparedData:
  cache = tmp_path_factory.mktemp("bundled_cache")
  return data.prepare_corpus(None, "byte", cache_dir=str(cache))


def _write(path: pathlib.Path, content: str | bytes) -> str:
  path.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(content, str):
    content = content.encode("utf-8")
  path.write_bytes(content)
  return str(path)


# ----------------------------------------------------------------------------
# Tokenizers.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "Hello world", "héllo wörld — ünïcödé ✓ 日本語 🙂\n\tend"])
def test_byte_round_trip(text):
  tok = data.get_tokenizer("byte")
  ids = tok.encode(text)
  assert ids == list(text.encode("utf-8"))
  assert all(0 <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text
  assert (tok.name, tok.vocab_size, tok.eot_token) == ("byte", 256, None)


def test_byte_decode_invalid_utf8_replaces():
  assert data.get_tokenizer("byte").decode([0xFF, 65]) == "\ufffdA"


@pytest.mark.parametrize(
  "text",
  ["Hello world", "héllo wörld — 日本語 🙂\n\n  spaces  \n", "KING LEAR. Nothing will come of nothing: speak again."],
)
def test_gpt2_round_trip(text):
  tok = data.get_tokenizer("gpt2")
  ids = tok.encode(text)
  assert all(0 <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text


def test_gpt2_known_ids():
  tok = data.get_tokenizer("gpt2")
  assert (tok.name, tok.vocab_size, tok.eot_token) == ("gpt2", 50257, 50256)
  assert tok.encode("Hello world") == [15496, 995]
  assert data.get_tokenizer("gpt2") is tok  # Built once.


def test_gpt2_endoftext():
  tok = data.get_tokenizer("gpt2")
  text = "a<|endoftext|>b"
  # By default the special string is ordinary text: a corpus cannot inject it.
  ordinary = tok.encode(text)
  assert 50256 not in ordinary
  assert tok.decode(ordinary) == text
  # With allow_special it is the single EOT token.
  special = tok.encode(text, allow_special=True)
  assert special == tok.encode("a") + [50256] + tok.encode("b")
  assert tok.decode([50256]) == "<|endoftext|>"


def test_unknown_tokenizer():
  with pytest.raises(ValueError, match=r"data\.tokenizer.*byte.*gpt2"):
    data.get_tokenizer("sentencepiece")


@pytest.mark.parametrize("chunk_chars", [64, 1000])
def test_chunked_gpt2_matches_whole(monkeypatch, tmp_path, chunk_chars):
  """Tokenising in chunks gives exactly the tokens of the whole text."""
  text = data.bundled_corpus_text()[:200_000]
  text += "tail  \n\n  with   odd\n \n whitespace\n"
  monkeypatch.setattr(data, "_CHUNK_CHARS", chunk_chars)
  monkeypatch.setattr(data, "_CHUNK_CHARS_MAX", 4 * chunk_chars)
  monkeypatch.setattr(data, "_READ_BLOCK", 3 * chunk_chars + 1)
  path = _write(tmp_path / "corpus.txt", text)
  prepared = data.prepare_corpus(path, "gpt2", cache_dir=str(tmp_path / "c"))
  got = np.concatenate([data.load_tokens(prepared.train_path), data.load_tokens(prepared.val_path)])
  np.testing.assert_array_equal(got, data.get_tokenizer("gpt2").encode(text))


# ----------------------------------------------------------------------------
# Preparing corpora.
# ----------------------------------------------------------------------------


def test_bundled_corpus_bytes(bundled_byte):
  text = data.bundled_corpus_text()
  raw = text.encode("utf-8")
  assert len(raw) > 4_000_000
  p = bundled_byte
  assert (p.tokenizer, p.vocab_size) == ("byte", 256)
  assert p.n_train + p.n_val == len(raw) == p.meta["n_tokens"]
  assert p.n_val == int(len(raw) * 0.1)
  train, val = data.load_tokens(p.train_path), data.load_tokens(p.val_path)
  assert isinstance(train, np.memmap) and train.dtype == np.uint16
  assert val.dtype == np.uint16
  assert (len(train), len(val)) == (p.n_train, p.n_val)
  assert train[:1000].tobytes() == np.frombuffer(raw[:1000], np.uint8).astype(np.uint16).tobytes()
  # The validation split is the tail of the stream.
  np.testing.assert_array_equal(val, np.frombuffer(raw[-p.n_val :], np.uint8))
  meta_path = pathlib.Path(p.train_path).with_name("meta.json")
  meta = json.loads(meta_path.read_text())
  assert meta == p.meta
  assert meta["source"] == data.BUNDLED_SOURCE
  assert len(meta["content_hash"]) == 64


def test_cache_reuse(bundled_byte):
  p = bundled_byte
  cache_dir = str(pathlib.Path(p.train_path).parents[1])
  mtimes = [os.stat(f).st_mtime_ns for f in (p.train_path, p.val_path)]
  again = data.prepare_corpus("", "byte", cache_dir=cache_dir)
  assert again == p
  assert [os.stat(f).st_mtime_ns for f in (p.train_path, p.val_path)] == mtimes


def test_cache_key_depends_on_content_and_val_fraction(tmp_path):
  cache = str(tmp_path / "cache")
  path = _write(tmp_path / "a.txt", "some text to train on\n" * 20)
  a = data.prepare_corpus(path, "byte", cache, val_fraction=0.1)
  b = data.prepare_corpus(path, "byte", cache, val_fraction=0.2)
  assert a.train_path != b.train_path
  assert b.n_val == int(a.meta["n_tokens"] * 0.2)
  _write(tmp_path / "a.txt", "other text to train on\n" * 20)
  c = data.prepare_corpus(path, "byte", cache, val_fraction=0.1)
  assert c.train_path != a.train_path
  assert c.meta["content_hash"] != a.meta["content_hash"]


def test_incomplete_cache_is_rebuilt(tmp_path):
  cache = str(tmp_path / "cache")
  path = _write(tmp_path / "a.txt", "0123456789" * 10)
  p = data.prepare_corpus(path, "byte", cache)
  # As if a previous run died after writing a short train file.
  with open(p.train_path, "r+b") as f:
    f.truncate(10)
  again = data.prepare_corpus(path, "byte", cache)
  assert len(data.load_tokens(again.train_path)) == p.n_train == 90
  # No temporary files are left behind.
  assert sorted(os.listdir(pathlib.Path(p.train_path).parent)) == ["meta.json", "train.bin", "val.bin"]


def test_default_cache_dir_uses_env(tmp_path):
  path = _write(tmp_path / "a.txt", "abc " * 50)
  p = data.prepare_corpus(path, "byte")
  assert p.train_path.startswith(str(tmp_path / "env_cache"))


def test_out_dir(tmp_path):
  path = _write(tmp_path / "a.txt", "abc " * 50)
  out = tmp_path / "out"
  p = data.prepare_corpus(path, "byte", out_dir=str(out))
  assert p.train_path == str(out / "train.bin")
  assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_folder_input(tmp_path):
  root = tmp_path / "corpus"
  _write(root / "b" / "deep" / "two.txt", "second document\n")
  _write(root / "a" / "one.txt", "first document\n")
  _write(root / ".hidden.txt", "never read\n")
  _write(root / "a" / "image.bin", b"\x89PNG\0\0\0binary")
  cache = str(tmp_path / "cache")
  p = data.prepare_corpus(str(root), "byte", cache, val_fraction=0.1)
  assert p.meta["files"] == ["a/one.txt", "b/deep/two.txt"]
  tokens = np.concatenate([data.load_tokens(p.train_path), data.load_tokens(p.val_path)])
  assert tokens.tobytes()[::2] == b"first document\n\n\nsecond document\n"
  # With GPT-2 the documents are separated by the EOT token.
  g = data.prepare_corpus(str(root), "gpt2", cache, val_fraction=0.5)
  tokens = np.concatenate([data.load_tokens(g.train_path), data.load_tokens(g.val_path)]).tolist()
  tok = data.get_tokenizer("gpt2")
  assert tokens == (tok.encode("first document\n") + [50256] + tok.encode("second document\n"))


def test_script(tmp_path):
  path = _write(tmp_path / "a.txt", "hello script " * 30)
  out = tmp_path / "out"
  result = subprocess.run(
    [
      sys.executable,
      str(_REPO / "scripts" / "prepare_data.py"),
      f"--input={path}",
      "--tokenizer=byte",
      f"--out_dir={out}",
      "--val_fraction=0.2",
    ],
    capture_output=True,
    text=True,
    check=True,
    cwd=_REPO,
  )
  assert "390 = train 312 + val 78" in result.stdout
  assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]
  bad = subprocess.run(
    [sys.executable, str(_REPO / "scripts" / "prepare_data.py"), f"--input={tmp_path / 'missing'}", f"--out_dir={out}"],
    capture_output=True,
    text=True,
    cwd=_REPO,
  )
  assert bad.returncode == 2 and "data.path" in bad.stderr
  assert "--input" in bad.stderr


# ----------------------------------------------------------------------------
# Batches.
# ----------------------------------------------------------------------------


def test_get_batch_deterministic(bundled_byte):
  tokens = data.load_tokens(bundled_byte.train_path)
  kw = dict(batch_size=4, seq_len=32)
  a = data.get_batch(tokens, seed=0, step=7, **kw)
  data.get_batch(tokens, seed=0, step=3, **kw)  # Call order does not matter.
  b = data.get_batch(tokens, seed=0, step=7, **kw)
  for k in ("inputs", "targets"):
    assert a[k].shape == (4, 32) and a[k].dtype == np.int32
    np.testing.assert_array_equal(a[k], b[k])
  c = data.get_batch(tokens, seed=0, step=8, **kw)
  d = data.get_batch(tokens, seed=1, step=7, **kw)
  assert not np.array_equal(a["inputs"], c["inputs"])
  assert not np.array_equal(a["inputs"], d["inputs"])
  np.testing.assert_array_equal(a["targets"][:, :-1], a["inputs"][:, 1:])


def test_get_batch_windows_are_contiguous():
  tokens = np.arange(1000, dtype=np.uint16)
  batch = data.get_batch(tokens, seed=3, step=11, batch_size=8, seq_len=16)
  x, y = batch["inputs"], batch["targets"]
  np.testing.assert_array_equal(np.diff(x, axis=1), 1)
  np.testing.assert_array_equal(y, x + 1)
  assert x.min() >= 0 and y.max() <= 999


def test_get_batch_exact_length_tokens():
  tokens = np.arange(17, dtype=np.uint16)  # Exactly seq_len + 1.
  batch = data.get_batch(tokens, seed=0, step=0, batch_size=3, seq_len=16)
  np.testing.assert_array_equal(batch["inputs"], np.tile(np.arange(16), (3, 1)))


def test_eval_batches_fixed(bundled_byte):
  tokens = data.load_tokens(bundled_byte.val_path)
  kw = dict(batch_size=4, seq_len=64, n_batches=3)
  a, b = data.eval_batches(tokens, **kw), data.eval_batches(tokens, **kw)
  assert len(a) == 3
  for x, y in zip(a, b):
    assert x["inputs"].shape == (4, 64) and x["inputs"].dtype == np.int32
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
    np.testing.assert_array_equal(x["targets"][:, :-1], x["inputs"][:, 1:])
  # The windows spread over the whole split.
  starts = np.arange(len(tokens))
  first = data.eval_batches(starts.astype(np.uint32), **kw)
  offsets = np.concatenate([batch["inputs"][:, 0] for batch in first])
  assert offsets.min() < len(tokens) / 12 and offsets.max() > len(tokens) * 0.8


# ----------------------------------------------------------------------------
# Errors name the config field to change.
# ----------------------------------------------------------------------------


def test_missing_path(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"data\.path"):
    data.prepare_corpus(str(tmp_path / "nope.txt"), "byte", str(tmp_path))


@pytest.mark.parametrize("content", ["", "   \n\n\t \n"])
def test_empty_file(tmp_path, content):
  path = _write(tmp_path / "empty.txt", content)
  with pytest.raises(ValueError, match=r"data\.path.*empty"):
    data.prepare_corpus(path, "byte", str(tmp_path / "cache"))


def test_empty_folder(tmp_path):
  (tmp_path / "corpus" / "sub").mkdir(parents=True)
  with pytest.raises(ValueError, match=r"data\.path"):
    data.prepare_corpus(str(tmp_path / "corpus"), "byte", str(tmp_path / "c"))


def test_folder_without_text_files(tmp_path):
  _write(tmp_path / "corpus" / "weights.npy", np.arange(100).tobytes())
  with pytest.raises(ValueError, match=r"data\.path.*no non-empty text"):
    data.prepare_corpus(str(tmp_path / "corpus"), "byte", str(tmp_path / "c"))


@pytest.mark.parametrize(
  "content",
  [
    np.arange(1000, dtype=np.int32).tobytes(),  # NUL bytes.
    bytes(range(128, 256)) * 20,  # Mostly invalid UTF-8.
  ],
)
def test_binary_file(tmp_path, content):
  path = _write(tmp_path / "data.txt", content)
  with pytest.raises(ValueError, match=r"data\.path.*not (a )?(UTF-8 )?text"):
    data.prepare_corpus(path, "byte", str(tmp_path / "cache"))


def test_few_invalid_bytes_are_replaced(tmp_path):
  path = _write(tmp_path / "latin.txt", ("plain ascii text " * 100).encode() + b"caf\xe9")
  p = data.prepare_corpus(path, "byte", str(tmp_path / "cache"))
  tail = data.load_tokens(p.val_path).tobytes()[::2]
  assert tail.endswith("caf\ufffd".encode())


def test_too_short_for_a_sequence(tmp_path):
  path = _write(tmp_path / "short.txt", "x" * 200)
  p = data.prepare_corpus(path, "byte", str(tmp_path / "cache"))
  assert (p.n_train, p.n_val) == (180, 20)
  data.check_seq_len(p, 19)
  with pytest.raises(ValueError, match=r"val split.*data\.path.*model\.n_ctx"):
    data.check_seq_len(p, 20)
  with pytest.raises(ValueError, match=r"train.*data\.path.*model\.n_ctx"):
    data.check_seq_len(p, 500)
  val = data.load_tokens(p.val_path)
  with pytest.raises(ValueError, match=r"data\.path.*model\.n_ctx"):
    data.get_batch(val, seed=0, step=0, batch_size=2, seq_len=20)
  with pytest.raises(ValueError, match=r"data\.path.*model\.n_ctx"):
    data.eval_batches(val, batch_size=2, seq_len=20, n_batches=1)


def test_too_few_tokens_for_val_split(tmp_path):
  path = _write(tmp_path / "tiny.txt", "hello")
  with pytest.raises(ValueError, match=r"data\.path.*data\.val_fraction"):
    data.prepare_corpus(path, "byte", str(tmp_path / "cache"))


def test_vocab_mismatch(bundled_byte, tmp_path):
  data.check_vocab(bundled_byte, 256)
  with pytest.raises(ValueError, match=r"model\.vocab_size.*data\.tokenizer"):
    data.check_vocab(bundled_byte, 255)
  path = _write(tmp_path / "a.txt", "hello " * 100)
  g = data.prepare_corpus(path, "gpt2", str(tmp_path / "cache"))
  data.check_vocab(g, 50304)
  with pytest.raises(ValueError, match=r"model\.vocab_size.*data\.tokenizer"):
    data.check_vocab(g, 256)


def test_bad_tokenizer_name(tmp_path):
  path = _write(tmp_path / "a.txt", "hello " * 100)
  with pytest.raises(ValueError, match=r"data\.tokenizer"):
    data.prepare_corpus(path, "bpe", str(tmp_path / "cache"))


@pytest.mark.parametrize("val_fraction", [0.0, -0.1, 0.51, 1.0])
def test_bad_val_fraction(tmp_path, val_fraction):
  path = _write(tmp_path / "a.txt", "hello " * 100)
  with pytest.raises(ValueError, match=r"data\.val_fraction"):
    data.prepare_corpus(path, "byte", str(tmp_path / "c"), val_fraction)


@pytest.mark.parametrize(
  "kw, field",
  [
    (dict(batch_size=0, seq_len=8), "trainer.batch_size"),
    (dict(batch_size=2, seq_len=0), "model.n_ctx"),
  ],
)
def test_bad_batch_sizes(kw, field):
  tokens = np.arange(100, dtype=np.uint16)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    data.get_batch(tokens, seed=0, step=0, **kw)


def test_load_tokens_errors(tmp_path):
  with pytest.raises(FileNotFoundError):
    data.load_tokens(tmp_path / "missing.bin")
  _write(tmp_path / "odd.bin", b"\x01\x02\x03")
  with pytest.raises(ValueError):
    data.load_tokens(tmp_path / "odd.bin")


def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path):
  # An id outside the embedding table would not fail inside JAX (the lookup returns garbage), so
  # the batch functions refuse it when told the vocabulary size, naming the file and the fields.
  ids = np.arange(100, dtype=np.uint16)
  ids[60] = 300
  path = tmp_path / "train.bin"
  ids.tofile(path)
  tokens = data.load_tokens(path)
  with pytest.raises(ValueError, match=r"train\.bin.*300.*model\.vocab_size.*data\.tokenizer"):
    for step in range(50):  # some batch covers position 60
      data.get_batch(tokens, seed=0, step=step, batch_size=8, seq_len=16, vocab_size=256)
  with pytest.raises(ValueError, match=r"model\.vocab_size"):
    data.eval_batches(tokens, batch_size=4, seq_len=16, n_batches=5, vocab_size=256)
  # Without a vocabulary size (or with one that fits) the ids pass through unchanged.
  batch = data.get_batch(tokens, seed=0, step=0, batch_size=8, seq_len=16, vocab_size=301)
  assert batch["inputs"].max() < 301
  assert data.eval_batches(tokens, batch_size=4, seq_len=16, n_batches=5)[0]["inputs"].shape == (4, 16)


# ----------------------------------------------------------------------------
# Properties.
# ----------------------------------------------------------------------------

_SETTINGS = hypothesis.settings(max_examples=40, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])


def _check_batch(batch, batch_size, seq_len, vocab_size):
  x, y = batch["inputs"], batch["targets"]
  assert x.shape == y.shape == (batch_size, seq_len)
  assert x.dtype == y.dtype == np.int32
  assert x.min() >= 0 and max(x.max(), y.max()) < vocab_size
  np.testing.assert_array_equal(y[:, :-1], x[:, 1:])


@_SETTINGS
@hypothesis.given(
  tokens=st.lists(st.integers(0, 50256), min_size=0, max_size=300),
  batch_size=st.integers(-1, 6),
  seq_len=st.integers(-1, 40),
  seed=st.integers(0, 2**32),
  step=st.integers(0, 10**6),
)
def test_property_token_files(tokens, batch_size, seq_len, seed, step):
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "tokens.bin")
    np.asarray(tokens, dtype=np.uint16).tofile(path)
    try:
      memmap = data.load_tokens(path)
      batch = data.get_batch(memmap, seed=seed, step=step, batch_size=batch_size, seq_len=seq_len)
    except ValueError as e:
      assert str(e)  # A clear message, never another exception type.
      return
    _check_batch(batch, batch_size, seq_len, 50257)
    assert len(tokens) >= seq_len + 1
    # Every row is a window of the token file.
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(tokens), seq_len + 1)
    for row in np.concatenate([batch["inputs"], batch["targets"][:, -1:]], 1):
      assert (windows == row).all(axis=1).any()


@_SETTINGS
@hypothesis.given(
  text=st.one_of(
    st.text(max_size=400),
    st.binary(max_size=400).map(lambda b: b.decode("latin-1")),
  ),
  raw=st.none() | st.binary(max_size=200),
  tokenizer=st.sampled_from(["byte", "gpt2"]),
  val_fraction=st.sampled_from([0.05, 0.1, 0.5, 0.6]),
  seq_len=st.integers(1, 16),
)
def test_property_text_corpus(text, raw, tokenizer, val_fraction, seq_len):
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "corpus.txt")
    content = raw if raw is not None else text.encode("utf-8")
    with open(path, "wb") as f:
      f.write(content)
    try:
      prepared = data.prepare_corpus(path, tokenizer, os.path.join(tmp, "cache"), val_fraction)
      data.check_seq_len(prepared, seq_len)
    except ValueError as e:
      assert str(e)
      return
    assert 0 < val_fraction <= 0.5
    assert content.strip()
    for split in (prepared.train_path, prepared.val_path):
      tokens = data.load_tokens(split)
      batch = data.get_batch(tokens, seed=1, step=2, batch_size=3, seq_len=seq_len)
      _check_batch(batch, 3, seq_len, prepared.vocab_size)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
  text=st.text(alphabet=st.sampled_from(list("ab Z'sl\n\t\r.,1é\u00a0\u3000\x1c")) | st.characters(), max_size=200),
  chunk_chars=st.integers(2, 30),
)
def test_property_chunking_is_exact(text, chunk_chars):
  """Chunks cut at safe points tokenise exactly like the whole text."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(data, "_CHUNK_CHARS", chunk_chars)
    mp.setattr(data, "_CHUNK_CHARS_MAX", 10**9)  # Never an unsafe cut.
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    chunks = list(data._safe_chunks(pieces))
  assert "".join(chunks) == text
  tok = data.get_tokenizer("gpt2")
  assert [t for c in chunks for t in tok.encode(c)] == tok.encode(text)


def test_a_folder_with_train_and_val_folders_is_its_own_held_out_split(tmp_path):
  corpus = tmp_path / "corpus"
  (corpus / "train").mkdir(parents=True)
  (corpus / "val").mkdir()
  (corpus / "train" / "a.txt").write_text("alpha beta gamma " * 50)
  (corpus / "train" / "b.txt").write_text("delta epsilon " * 40)
  (corpus / "val" / "c.txt").write_text("zeta eta theta " * 30)
  (corpus / "SOURCES.json").write_text('{"unread": "beside the split"}')
  assert data.split_folders(str(corpus)) and not data.split_folders(str(corpus / "train"))
  prepared = data.prepare_corpus(str(corpus), "byte", str(tmp_path / "cache"))
  # the val split is the val/ folder's tokens exactly, whatever data.val_fraction says
  val = data.load_tokens(prepared.val_path)
  assert bytes(np.asarray(val, dtype=np.uint8)) == ("zeta eta theta " * 30).encode()
  # the two documents with a blank line between them
  assert prepared.n_train == len("alpha beta gamma " * 50) + len("delta epsilon " * 40) + 2
  assert prepared.meta["val_fraction"] is None and "val/" in prepared.meta["held_out"]
  again = data.prepare_corpus(str(corpus), "byte", str(tmp_path / "cache"), val_fraction=0.3)
  assert again.train_path == prepared.train_path  # the split does not depend on val_fraction


def test_the_no_repeat_order_draws_every_window_once_as_a_function_of_seed_and_step():
  tokens = np.arange(1000, dtype=np.uint16)
  seq_len, batch = 9, 4  # windows of 10 tokens: 100 of them
  assert data.no_repeat_windows(len(tokens), seq_len) == 100
  draw = data.no_repeat_batches(tokens, seed=3, batch_size=batch, seq_len=seq_len)
  starts = np.concatenate([draw(step)["inputs"][:, 0] for step in range(25)])
  assert sorted(starts.tolist()) == list(range(0, 1000, 10))  # every window once, none twice
  chex.assert_trees_all_equal(draw(7), data.no_repeat_batches(tokens, seed=3, batch_size=batch, seq_len=seq_len)(7))
  other = data.no_repeat_batches(tokens, seed=4, batch_size=batch, seq_len=seq_len)(0)
  assert not np.array_equal(other["inputs"], draw(0)["inputs"])
  np.testing.assert_array_equal(draw(2)["targets"][:, :-1], draw(2)["inputs"][:, 1:])
  with pytest.raises(ValueError, match=r"--config\.data\.order='no_repeat': 26 steps of 4 windows need 104"):
    draw(25)
  with pytest.raises(ValueError, match=r"holds 100 non-overlapping windows .* or data\.order='random'"):
    data.check_no_repeat(len(tokens), seq_len, steps=30, batch_size=batch)
