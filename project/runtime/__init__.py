"""The distributed runtime: how the ranks start, join, stop and fail. Touch it to change how a run is launched or
supervised, not to change what it trains.

- ``strategy.py``: Lightning's DDP, without the wrapper for one process, surviving torchrun restarts;
- ``launcher.py``: local CPU ranks forked from rank 0 instead of re-running the command;
- ``guard.py``: ``RunGuard``, the callback every run gets (fail-fast, NaN guard, RNG states, preemption, samples/s);
- ``preemption.py``: on SIGTERM or SLURM's requeue signal every rank stops at the same step and saves (and the job
  is requeued); ``requeue_signal.py``: that signal caught from the first line; ``faults.py``: failures named, peers
  stopped, NaN caught; ``throughput.py``: FLOPs and MFU;
- ``known_noise.py``: third-party warnings silenced by message, for the versions known to emit them.
"""
