"""A PyTorch Lightning template for distributed training: the same code on one CPU, many GPUs and many nodes.

What you edit to make it yours: ``networks.py`` (the network), ``module.py`` (loss, metrics, optimizer), ``data/``
(data sources) and ``configs/``. The machinery: ``cli.py`` (the command line), ``commands/`` (the other commands),
``runtime/`` (how processes start, talk, stop and fail), ``runs/`` (what a run leaves on disk: run folders,
checkpoints, logs) and ``lightning_internals.py`` (the one module that uses Lightning's private API).
"""
