"""trainfleet: the machinery of distributed training with PyTorch Lightning, so that a project holds only its own code.

A project's ``__main__`` calls ``trainfleet.main.run``; its configs name the library's classes (strategies, loggers,
data sources). Inside: ``cli.py`` (the command line), ``commands/`` (doctor, sweep, consolidate), ``runtime/`` (how
processes start, talk, stop and fail), ``runs/`` (run folders, logs, outcomes), ``checkpoints/``, ``data/`` (data
sources, samplers, loaders), ``testing.py`` (suites a project's tests apply to its classes) and
``lightning_internals.py`` (the one module that uses Lightning's private API). The public surface is what configs,
launch scripts and a project's code name; everything else may change between versions.
"""
