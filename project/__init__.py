"""A PyTorch Lightning project for distributed training: the same code on one CPU, many GPUs and many nodes.

What is yours to edit: ``networks.py`` (the networks), ``module.py`` (loss, metrics, optimizer), ``schedules.py``
(learning-rate schedules), ``data.py`` (data sources), ``callbacks.py`` and ``configs/``. How processes start, talk,
stop, fail and save is the ``trainfleet`` library's: its version is pinned in ``uv.lock``.
"""
