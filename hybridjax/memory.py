"""Memory readings with their source.

On GPU and TPU, `device.memory_stats()` reports `bytes_in_use`, `peak_bytes_in_use` and
`bytes_limit`. On CPU it returns None; then we report the total bytes of `jax.live_arrays()` and the
process RSS, each labelled with its source so no figure is mistaken for another. On a mesh of
several local devices `bytes_in_use` is per device (the fullest one); see `live_bytes_by_device`.
`count_copies` reads the copies a compiled step makes inside itself, which no reading between
steps can see.
"""

from __future__ import annotations

import gc
import os
import re
from typing import Any

import jax
import numpy as np


def process_rss_bytes() -> int:
  """Resident set size of this process, from /proc (Linux) or `resource` elsewhere."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _buffers(a: jax.Array) -> list[tuple[tuple[int, object], int]]:
  """((device id, buffer key), bytes) for each of `a`'s buffers on this process's devices.

  Keys are buffer pointers, so Array objects that alias one buffer count once: an orbax save leaves
  a second Array per saved buffer, and reading a sharded array's `addressable_shards` keeps one
  single-device Array per shard alive, both over buffers that are already counted.
  """
  try:
    devices = a.sharding.device_set
    if len(devices) == 1:  # the common case, kept cheap
      return [((next(iter(devices)).id, a.unsafe_buffer_pointer()), int(a.nbytes))]
    return [((s.device.id, s.data.unsafe_buffer_pointer()), int(s.data.nbytes)) for s in a.addressable_shards]
  except Exception:  # deleted meanwhile, or no buffer pointers on this backend: count the object
    return [((-1, id(a)), int(a.nbytes))]


def _live_buffers() -> dict[tuple[int, object], int]:
  seen: dict[tuple[int, object], int] = {}
  for a in jax.live_arrays():
    for key, nbytes in _buffers(a):
      seen.setdefault(key, nbytes)
  return seen


def live_array_stats() -> tuple[int, int]:
  """(count, total bytes) of the distinct device buffers behind this process's live jax arrays.

  Arrays are de-duplicated by buffer: after an orbax save a second Array object aliases each saved
  buffer (same pointer, freed with it), which is no extra memory and is not counted twice. A
  sharded array counts one buffer per local device it lives on.
  """
  seen = _live_buffers()
  return len(seen), int(sum(seen.values()))


def live_bytes_by_device() -> dict[int, int]:
  """{device id: bytes of the distinct live buffers on it}, for this process's devices.

  On a mesh this is the per-device memory: a replicated leaf counts in full on every device, an
  FSDP-sharded one only with its shard.
  """
  return _bytes_by_device(_live_buffers())


def _bytes_by_device(buffers: dict[tuple[int, object], int]) -> dict[int, int]:
  per = {d.id: 0 for d in jax.local_devices()}
  for (device_id, _), nbytes in buffers.items():
    per[device_id] = per.get(device_id, 0) + nbytes
  return per


def _device_stats(device: jax.Device) -> dict[str, Any] | None:
  try:
    return device.memory_stats()
  except Exception:  # some backends raise instead of returning None
    return None


def memory_snapshot(device: jax.Device | None = None) -> dict[str, Any]:
  """One reading. `bytes_in_use` is always present; `source` says where it came from.

  With several local devices (a mesh) and no `device` given, `bytes_in_use` is per device: that of
  the fullest one, which is what runs out first; `devices` and `device_live_bytes` (live-array bytes
  on the fullest device) are added.
  """
  devices = [device] if device is not None else jax.local_devices()
  buffers = _live_buffers()
  live_bytes = int(sum(buffers.values()))
  snap: dict[str, Any] = {"live_arrays": len(buffers), "live_bytes": live_bytes, "rss_bytes": process_rss_bytes()}
  if len(devices) > 1:
    per = _bytes_by_device(buffers)
    snap.update(devices=len(devices), device_live_bytes=max(per.get(d.id, 0) for d in devices))
  stats = [_device_stats(d) for d in devices]
  suffix = f" (max over {len(devices)} devices)" if len(devices) > 1 else ""
  if all(st and "bytes_in_use" in st for st in stats):
    fullest = max(stats, key=lambda st: st["bytes_in_use"])
    snap.update(
      source="device.memory_stats" + suffix,
      bytes_in_use=int(fullest["bytes_in_use"]),
      peak_bytes_in_use=max(int(st.get("peak_bytes_in_use", st["bytes_in_use"])) for st in stats),
      bytes_limit=int(fullest.get("bytes_limit", 0)),
    )
  else:
    snap.update(source="jax.live_arrays" + suffix, bytes_in_use=snap.get("device_live_bytes", live_bytes))
  return snap


class MemoryTracker:
  """Keeps start, peak and end readings for the run summary."""

  def __init__(self):
    self.start: dict[str, Any] | None = None
    self.after_warmup: dict[str, Any] | None = None
    self.last: dict[str, Any] | None = None
    self.peak_bytes = 0
    self.peak_rss = 0

  def record(self) -> dict[str, Any]:
    self.last = snap = memory_snapshot()
    self.start = self.start or snap
    self.observe(snap)
    return snap

  def observe(self, snap: dict[str, Any]) -> None:
    """Counts a reading taken elsewhere (e.g. at a phase transition) towards the peaks."""
    self.peak_bytes = max(self.peak_bytes, snap.get("peak_bytes_in_use", snap["bytes_in_use"]))
    self.peak_rss = max(self.peak_rss, snap["rss_bytes"])

  def mark_after_warmup(self) -> None:
    # Growth is measured from this reading to the end-of-run one, which the loop also takes after a
    # collection. Collecting here too keeps arrays left unreachable by earlier work in the process
    # (another run in a notebook, a previous test) from being freed in between and showing as a
    # negative growth that could hide a real one.
    gc.collect()
    self.after_warmup = self.record()

  def summary(self) -> dict[str, Any]:
    if self.start is None:
      return {}
    ref = self.after_warmup or self.start
    return {
      "source": self.last["source"],
      "start_bytes": self.start["bytes_in_use"],
      "peak_bytes": self.peak_bytes,
      "end_bytes": self.last["bytes_in_use"],
      "growth_bytes": self.last["bytes_in_use"] - ref["bytes_in_use"],
      "start_rss": self.start["rss_bytes"],
      "peak_rss": self.peak_rss,
      "end_rss": self.last["rss_bytes"],
      "rss_growth": self.last["rss_bytes"] - ref["rss_bytes"],
    }


def format_bytes(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if abs(n) < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024


# `name = shape opcode(`; the shape may be a tuple `(...)`, names may or may not start with '%'.
_INSTR = re.compile(
  r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\(.*?\)|[\w]+\[[^\]]*\](?:\{[^}]*\})?)\s+(?P<op>[\w\-]+)\("
)
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
# A computation starts on an unindented line ending in '{': `[ENTRY] [%]name [(params) -> shape] {`.
_COMP_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\b.*\{\s*$")
_FUSION_CALLS = re.compile(r"\bfusion\(.*?\bcalls=%?([\w.\-]+)")


def _shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape string (arrays summed over a tuple; tokens and opaque count 0)."""
  return sum(
    int(np.prod([int(d) for d in dims.split(",") if d] or [1]) * _dtype_bytes(dtype))
    for dtype, dims in _ARRAY.findall(shape)
  )


def _dtype_bytes(dtype: str) -> float:
  """Bytes per element of an HLO element type: its bit width / 8 (s4: 0.5, f8e4m3fn: 1, c64: 8), pred 1,
  a token or opaque 0."""
  if dtype == "pred":
    return 1
  width = re.match(r"(?:[suf]|bf|c)(\d+)", dtype)
  return int(width[1]) / 8 if width else 0


def list_copies(hlo_text: str) -> list[dict[str, Any]]:
  """Every copy that runs as its own instruction in optimized HLO: `copy`, and `copy-start`/
  `copy-done` pairs counted once (at copy-done), with its bytes, its computation and whether that is
  the ENTRY computation (outside every loop and branch). Copies inside fusion computations are part
  of a fused kernel (layout changes), not buffer copies, and are skipped."""
  fused = set(_FUSION_CALLS.findall(hlo_text))
  out, comp, entry = [], None, False
  for line in hlo_text.splitlines():
    header = _COMP_HEADER.match(line)
    if header and not line.startswith("HloModule"):  # (an indented line never matches)
      comp, entry = header["name"], line.startswith("ENTRY")
      continue
    m = _INSTR.match(line)
    if m and m["op"] in ("copy", "copy-done") and comp not in fused:
      out.append(
        {"name": m["name"], "shape": m["shape"], "bytes": _shape_bytes(m["shape"]), "computation": comp, "entry": entry}
      )
  return out


def count_copies(compiled: Any, *, entry_only: bool = False) -> tuple[int, int]:
  """(number, bytes) of the buffer copies in a compiled program (`jax.jit(f).lower(...).compile()`)
  or its optimized HLO text. A static count: a copy inside a loop body counts once.

  A copy of a params-sized buffer inside a step is memory traffic that donation was meant to save,
  and no memory reading between steps can see it; tests pin these counts for the hybrid steps.
  """
  copies = list_copies(compiled if isinstance(compiled, str) else compiled.as_text())
  if entry_only:  # outside every loop and branch: what runs whichever transition is selected
    copies = [c for c in copies if c["entry"]]
  return len(copies), sum(c["bytes"] for c in copies)
