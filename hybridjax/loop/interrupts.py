"""What stops or pauses the loop's clock: SIGINT and SIGTERM caught while `train` runs (the state saved
at the next step boundary, `TrainingInterrupted`), and the stopwatch of the training steps alone."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any


class TrainingInterrupted(KeyboardInterrupt):
  """Raised by `train` after SIGINT (Ctrl-C) or SIGTERM, once the state at the last finished step is
  saved; `exit_code` is the shell's for the signal (130, 143). A second Ctrl-C aborts at once, with a
  plain KeyboardInterrupt and no save."""

  def __init__(self, signum: int, step: int, saved: bool, workdir: str):
    self.signum, self.step, self.saved = signum, step, saved
    self.exit_code = 128 + signum
    kept = (
      f"the state at step {step} is saved in {workdir}: run the same command to resume it"
      if saved
      else f"nothing was saved at step {step} (its last step was non-finite); the last checkpoint is kept"
    )
    super().__init__(f"interrupted by {signal.Signals(signum).name}: {kept}")


class _Interrupts:
  """SIGINT and SIGTERM, caught while `train` runs in the main thread: the first sets `signum` (the
  loop saves and stops at its next step boundary), a second SIGINT raises KeyboardInterrupt at once.
  The previous handlers are back on exit."""

  def __init__(self, enabled: bool):
    self.signum: int | None = None
    self._enabled = enabled and threading.current_thread() is threading.main_thread()
    self._previous: dict[int, Any] = {}

  def _handle(self, signum: int, frame: Any) -> None:
    del frame
    if self.signum is not None and signum == signal.SIGINT:
      signal.signal(signal.SIGINT, self._previous.get(signal.SIGINT, signal.default_int_handler))
      raise KeyboardInterrupt("second Ctrl-C: aborted without saving")
    self.signum = signum
    print(
      f"\n{signal.Signals(signum).name}: saving a checkpoint at the end of this step, then stopping "
      "(Ctrl-C again aborts without saving)",
      flush=True,
    )

  def __enter__(self) -> _Interrupts:
    if self._enabled:
      for sig in (signal.SIGINT, signal.SIGTERM):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc: Any) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class Stopwatch:
  """Wall time of the training steps alone: paused while the loop compiles, evaluates or saves."""

  def __init__(self):
    self.total = 0.0
    self._since: float | None = None

  def resume(self) -> None:
    if self._since is None:
      self._since = time.perf_counter()

  def pause(self) -> None:
    if self._since is not None:
      self.total += time.perf_counter() - self._since
      self._since = None
