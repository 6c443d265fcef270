"""What a run leaves on disk, and how the next run finds it. Touch it to change where runs go, what they log or how
they are checkpointed.

- ``folders.py``: one folder per run, ``--ckpt_path last|best|auto``, the saved config and tracker ids;
- ``checkpointing.py``: atomic, weights-only checkpoints with every rank's RNG states; ``resume_state.py``: the
  callback that saves and restores them, and the ``metrics.csv`` rows, for an exact resume;
- ``loggers.py``: Lightning's CSV logger, appending when a run resumes; ``outputs.py``: the progress bar, test
  metrics and predictions files.
"""
