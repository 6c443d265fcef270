"""A rank whose own step time stays well above the others' (a throttled CPU, a slow disk) is named, with its host.

Under DDP every rank's wall time per step is the same: the ranks wait for each other in the gradient all-reduce, so
the slow one cannot be seen from the step time. What differs is each rank's own work: the wait for its batch (from
the end of its previous step to the start of this one) plus its forward pass (from the start of the step to
``on_before_backward``). ``StepTimes`` measures that on every step with a clock read and no collective; the
preemption check's periodic all-reduce (``preemption.PreemptionCheck``) carries each rank's figure for the window,
so naming the slow rank costs no collective of its own.

A rank's figure for a window is the median of its steps' own times: one step made long by something else (rank 0's
checkpoint save, a validation pass between two steps) does not move it, a rank slow on every step does. A rank is
slow when its figure is above ``SLOW_RATIO`` x the median of the other ranks' and at least ``SLOW_MARGIN_S`` above
it (a toy step's noise is a fraction of a millisecond), at ``SLOW_CHECKS`` checks in a row. Rank 0 then prints one
line, once per slow episode: the rank stays named until a check finds it no longer slow. Each naming is also kept
(``named``) for the attempt's goodput record (runs/goodput.py).
"""

import socket
import statistics
import time

import torch.distributed as dist

from trainfleet.messages import report

SLOW_RATIO = 1.5  # a rank's own time a step against the median of the others'
SLOW_MARGIN_S = 0.005  # and at least this much above it, so that noise on a sub-millisecond step never fires
SLOW_CHECKS = 2  # consecutive checks before a rank is named: one long window (a hiccup) is not a slow rank
MAX_MICROSECONDS = 2**31 - 1  # the slot is int32, as the flags': 35 minutes a step


class StepTimes:
    """Each rank's own work a step (the wait for its batch plus its forward), and rank 0's verdict on the ranks."""

    def __init__(self) -> None:
        self.hosts: list[str] = []
        self._times: list[float] = []  # this rank's own seconds for each step of the window
        self._start: float | None = None
        self._forward: float | None = None
        self._end: float | None = None  # the end of the previous step; None at the start of an epoch
        self._slow_checks: dict[int, int] = {}  # rank: consecutive checks found slow
        self._in_episode: set[int] = set()  # ranks in a slow episode already printed
        self.named: list[dict] = []  # each naming: rank, host, step, own and others' ms, when (for the goodput record)

    def gather_hosts(self, group: dist.ProcessGroup | None, world_size: int) -> None:
        """Once at setup, not per check: every rank's host name, for the line that names a slow rank."""
        hosts: list[str | None] = [None] * world_size
        dist.all_gather_object(hosts, socket.gethostname(), group=group)
        self.hosts = [str(host) for host in hosts]

    def epoch_start(self) -> None:
        """The first batch of an epoch waits for the loader's start (and whatever ran after the last epoch): not
        counted as waiting for data."""
        self._end = None

    def batch_start(self) -> None:
        self._start, self._forward = time.perf_counter(), None

    def before_backward(self) -> None:
        """The forward ends here; backward waits for the other ranks in the gradient all-reduce: not counted."""
        if self._forward is None and self._start is not None:
            self._forward = time.perf_counter() - self._start

    def batch_end(self) -> None:
        """After the step's own work and the check (whose save and exchange are not this rank's own work). Kept only
        once the hosts are gathered: one process has no other rank to compare with, and no check to empty the list."""
        if self.hosts and self._start is not None and self._forward is not None:
            waited = self._start - self._end if self._end is not None else 0.0
            self._times.append(waited + self._forward)
        self._start, self._end = None, time.perf_counter()

    def window_microseconds(self) -> int:
        """This rank's figure for the window since the last check (the median step), in µs; the window restarts."""
        own = statistics.median(self._times) if self._times else 0.0
        self._times = []
        return min(round(own * 1e6), MAX_MICROSECONDS)

    def judge(self, microseconds: list[int], window_steps: int, step: int) -> list[str]:
        """From every rank's figure at STEP, the lines naming the ranks newly slow for ``SLOW_CHECKS`` checks in a
        row."""
        lines = []
        if len(microseconds) < 2:
            return lines
        for rank, own_us in enumerate(microseconds):
            others = statistics.median(us for other, us in enumerate(microseconds) if other != rank)
            slow = own_us > SLOW_RATIO * others and own_us - others >= SLOW_MARGIN_S * 1e6
            self._slow_checks[rank] = self._slow_checks.get(rank, 0) + 1 if slow else 0
            if not slow:
                self._in_episode.discard(rank)  # the episode ended: a later one is printed again
            elif self._slow_checks[rank] >= SLOW_CHECKS and rank not in self._in_episode:
                self._in_episode.add(rank)
                host = self.hosts[rank] if rank < len(self.hosts) else "?"
                ratio = f"{own_us / others:.1f}x" if others else "the others at 0"
                lines.append(
                    f"rank {rank} (host {host}) is slow at step {step}: {own_us / 1e3:.1f} ms of its own work a step"
                    f" (the wait for its batch and its forward) against a median of {others / 1e3:.1f} ms on the"
                    f" other ranks over the last {window_steps} steps ({ratio})"
                )
                named = {"rank": rank, "host": host, "step": step, "own_ms": own_us / 1e3, "others_ms": others / 1e3}
                self.named.append({**named, "at": time.time()})
        return lines

    def report(self, microseconds: list[int], window_steps: int, step: int, is_global_zero: bool) -> None:
        """Every rank keeps the verdict's state; rank 0 prints it."""
        for line in self.judge(microseconds, window_steps, step):
            if is_global_zero:
                report(line)
