"""The distributed runtime: how the ranks start, join, stop and fail. Touch it to change how a run is launched or
supervised, not to change what it trains.

- ``strategy.py``: Lightning's DDP, without the wrapper for one process, surviving torchrun restarts;
- ``launcher.py``: local CPU ranks forked from rank 0 instead of re-running the command;
- the callbacks every run gets (``cli.add_safeguards``), one concern each: ``faults.py`` (``FailFast``: failures
  named, peers stopped, the heartbeat), ``nan_guard.py`` (``NaNGuard``), ``throughput.py`` (``Throughput``: samples/s,
  FLOPs and MFU), ``preemption.py`` (``PreemptionCheck``: on SIGTERM, SLURM's requeue signal or Ctrl-C every rank stops
  at the same step and saves, and the job is requeued); ``requeue_signal.py``: that signal caught from the first line;
- ``known_noise.py``: third-party warnings silenced by message, for the versions known to emit them.
"""
