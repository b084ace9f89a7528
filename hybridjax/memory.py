"""Memory readings with their source.

On GPU and TPU, `device.memory_stats()` reports `bytes_in_use`, `peak_bytes_in_use` and
`bytes_limit`. On CPU it returns None; then we report the total bytes of `jax.live_arrays()` and the
process RSS, each labelled with its source so no figure is mistaken for another.
"""

from __future__ import annotations

import os
from typing import Any

import jax


def process_rss_bytes() -> int:
  """Resident set size of this process, from /proc (Linux) or `resource` elsewhere."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _buffer_key(a: jax.Array) -> object:
  try:  # single-device arrays: two Array objects can share one buffer (orbax's save makes such views)
    return a.unsafe_buffer_pointer()
  except Exception:  # sharded or deleted arrays: count the object itself
    return id(a)


def live_array_stats() -> tuple[int, int]:
  """(count, total bytes) of the distinct device buffers behind this process's live jax arrays.

  Arrays are de-duplicated by buffer: after an orbax save a second Array object aliases each saved
  buffer (same pointer, freed with it), which is no extra memory and is not counted twice.
  """
  seen: dict[object, int] = {}
  for a in jax.live_arrays():
    seen.setdefault(_buffer_key(a), int(a.nbytes))
  return len(seen), int(sum(seen.values()))


def memory_snapshot(device: jax.Device | None = None) -> dict[str, Any]:
  """One reading. `bytes_in_use` is always present; `source` says where it came from."""
  device = device or jax.devices()[0]
  stats = None
  try:
    stats = device.memory_stats()
  except Exception:  # some backends raise instead of returning None
    stats = None
  n_live, live_bytes = live_array_stats()
  snap: dict[str, Any] = {"live_arrays": n_live, "live_bytes": live_bytes,
                          "rss_bytes": process_rss_bytes()}
  if stats and "bytes_in_use" in stats:
    snap.update(
        source="device.memory_stats",
        bytes_in_use=int(stats["bytes_in_use"]),
        peak_bytes_in_use=int(stats.get("peak_bytes_in_use", stats["bytes_in_use"])),
        bytes_limit=int(stats.get("bytes_limit", 0)),
    )
  else:
    snap.update(source="jax.live_arrays", bytes_in_use=live_bytes)
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
    snap = memory_snapshot()
    if self.start is None:
      self.start = snap
    self.last = snap
    self.observe(snap)
    return snap

  def observe(self, snap: dict[str, Any]) -> None:
    """Counts a reading taken elsewhere (e.g. at a phase transition) towards the peaks."""
    self.peak_bytes = max(self.peak_bytes, snap.get("peak_bytes_in_use", snap["bytes_in_use"]))
    self.peak_rss = max(self.peak_rss, snap["rss_bytes"])

  def mark_after_warmup(self) -> None:
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
  return f"{n:.1f} TiB"
