"""A local worker outlives no driver: killed, the driver leaves no process training on."""

from __future__ import annotations

import os
import subprocess
import sys
import time

# The driver (a child process) starts a grandchild that watches it as a pool worker does, prints the
# grandchild's pid, and is killed; the grandchild would sleep a minute.
DRIVER = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", (
  "import os, threading, time\\n"
  "from hybridjax.bench.runs import worker\\n"
  "threading.Thread(target=worker.exit_with_parent, args=(os.getppid(), 0.05), daemon=True).start()\\n"
  "time.sleep(60)\\n")])
print(child.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split()[2] != "Z"  # a zombie has ended
  except FileNotFoundError:
    return False


def test_a_worker_ends_when_its_driver_is_killed():
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  env = dict(os.environ, PYTHONPATH=root)
  driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
  child = int(driver.stdout.readline())
  time.sleep(0.5)
  assert _alive(child)  # it watches a living driver and goes on
  driver.kill()
  driver.wait()
  deadline = time.monotonic() + 30
  while _alive(child) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not _alive(child)
