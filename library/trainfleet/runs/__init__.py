"""What a run leaves on disk, and how the next run finds it. Touch it to change where runs go or what they log (how
they are checkpointed: ``trainfleet/checkpoints/``).

- ``folders.py``: one folder per run, ``--ckpt_path last|best|auto``, the saved config and tracker ids;
- ``loggers.py: Lightning's CSV logger, appending when a run resumes; ``outputs.py``: the progress bar, test
  metrics and predictions files.
"""
