"""benchmarks/recovery.py's clock: a process's start as the restarted run's timeline reads it."""

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.recovery import process_start_time  # noqa: E402


@pytest.mark.slow  # a fork, though a short one
def test_a_process_start_is_read_to_the_clock_tick():
    """A child forked between two clock readings starts between them (within one tick, 10 ms)."""
    reader, writer = os.pipe()
    before = time.time()
    child = os.fork()
    if child == 0:
        os.write(writer, repr(process_start_time()).encode())
        os._exit(0)
    os.close(writer)
    started = float(os.read(reader, 64))
    after = time.time()
    os.waitpid(child, 0)
    os.close(reader)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert before - tick <= started <= after + tick
