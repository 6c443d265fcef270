"""Checkpoints: how they are written and read, when, and what they hold for an exact resume. Touch it to change any
of the three.

- ``files.py``: atomic and background-written checkpoint files, sharded (FSDP2) folders, weights-only reads, checks
  before loading, every rank's RNG states;
- ``resume_state.py``: the callback that saves those RNG states and the ``metrics.csv`` rows, and restores them;
- ``last.py``: ``last.ckpt`` now, on every rank's call; ``periodic.py``: ``last.ckpt`` every so much training time.

Where they are read: ``runs/folders.py`` finds the checkpoint a run resumes from, ``runtime/strategy.py`` and
``runtime/sharding.py`` load it, ``data/base.py`` keeps the loader's position in it.
"""
