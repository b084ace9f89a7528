r"""Tokenises a text corpus into nanoGPT-style uint16 token files.

Writes `train.bin`, `val.bin` and `meta.json` into --out_dir (or, without it,
into the cache that training reads: `$HYBRIDJAX_CACHE` or
`~/.cache/hybridjax/data`). An up-to-date --out_dir is reused as it is.

  python scripts/prepare_data.py  # the bundled Shakespeare, byte tokens
  python scripts/prepare_data.py --input=my_texts/ --tokenizer=gpt2 \
      --out_dir=/tmp/my_texts_gpt2 --val_fraction=0.05
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from hybridjax import data

# The config fields that error messages name, and their flags here.
_FLAG_FOR_FIELD = {
  "data.path": "--input",
  "data.tokenizer": "--tokenizer",
  "data.val_fraction": "--val_fraction",
}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "--input",
    default="",
    help="a text file or a folder of text files; '' (the default) is the bundled Shakespeare corpus",
  )
  parser.add_argument("--tokenizer", default="byte", choices=data.TOKENIZERS, help="the tokenizer (default: byte)")
  parser.add_argument("--out_dir", default="", help="where to write the files; '' (the default) is the data cache")
  parser.add_argument(
    "--cache_dir",
    default="",
    help="the cache root when --out_dir is not given; '' is $HYBRIDJAX_CACHE or ~/.cache/hybridjax/data",
  )
  parser.add_argument(
    "--val_fraction", type=float, default=0.1, help="share of the tokens, at the end, held out for validation"
  )
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
  """Runs the CLI; returns the exit status."""
  args = _parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  start = time.perf_counter()
  try:
    prepared = data.prepare_corpus(
      args.input,
      args.tokenizer,
      cache_dir=args.cache_dir or None,
      val_fraction=args.val_fraction,
      out_dir=args.out_dir or None,
    )
  except (ValueError, FileNotFoundError) as e:
    flags = ", ".join(f"{field} is {flag}" for field, flag in _FLAG_FOR_FIELD.items() if field in str(e))
    print(f"error: {e}", file=sys.stderr)
    if flags:
      print(f"(on this command line, {flags})", file=sys.stderr)
    return 2
  elapsed = time.perf_counter() - start

  meta = prepared.meta
  print(f"source:     {meta['source']} ({len(meta['files'])} file(s))")
  print(f"tokenizer:  {prepared.tokenizer} (vocab {prepared.vocab_size})")
  print(f"tokens:     {meta['n_tokens']:,} = train {prepared.n_train:,} + val {prepared.n_val:,}")
  print(f"train:      {prepared.train_path}")
  print(f"val:        {prepared.val_path}")
  print(f"time:       {elapsed:.2f}s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
