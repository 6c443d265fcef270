"""A PyTorch Lightning template for distributed training: the same code on one CPU, many GPUs and many nodes.

What you edit to make it yours: ``networks.py`` (the network), ``module.py`` (loss, metrics, optimizer),
``data/`` (data sources) and ``configs/``. The machinery: ``cli.py`` (the command line), ``runtime/`` (how processes
start, talk, stop and fail) and ``runs/`` (what a run leaves on disk: run folders, checkpoints, logs, sweeps).
"""

import functools
import importlib
import importlib.abc
import importlib.util
import sys

# Modules that moved when the package got runtime/ and runs/: configs saved by earlier runs name them in class
# paths (``project.strategy.DDPStrategy``, ``project.loggers.CSVLogger``), so
# those names still import, as the new module.
MOVED = {
    "project.strategy": "project.runtime.strategy",
    "project.loggers": "project.runs.loggers",
    "project.sweep": "project.runs.sweep",
    "project.mnist": "project.data.mnist",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name in ``MOVED`` as a module whose attributes are the new module's."""

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: object) -> None:
        module.__getattr__ = functools.partial(getattr, importlib.import_module(MOVED[module.__name__]))


sys.meta_path.append(_MovedModules())
