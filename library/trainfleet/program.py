"""The project the library runs for, named once by the project's ``__main__`` (``trainfleet.main.run``): its package,
which every command line (``python -m PACKAGE``) and every line the library prints (``[PACKAGE] ...``) names, and its
LightningModule, the CLI's ``model``."""

import importlib

package = "trainfleet"  # until a project's __main__ names itself
module_class_path = ""  # "PACKAGE.module.ClassName"


def serve(package_name: str, module_class: str) -> None:
    """Names the project: PACKAGE_NAME (importable) and MODULE_CLASS, its LightningModule's class path."""
    global package, module_class_path
    package, module_class_path = package_name, module_class


def prefix() -> str:
    """What starts each line the library prints: the user reads their project's name, not the library's."""
    return f"[{package}]"


def lightning_module() -> type:
    """The project's LightningModule class, imported when the CLI is built (torch is imported by then)."""
    if not module_class_path:
        raise RuntimeError("no project named: its __main__ calls trainfleet.main.run(package, module_class)")
    module, _, name = module_class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)
