"""How the command line reports bad input: the cause on one screen, then exit 2.

jsonargparse prints a subcommand's whole usage (about 70 lines) before its error line, names a mistyped key without
the key meant, and wraps an exception raised by a config class's constructor (a data module refusing its CSV) in a
"Does not validate against any of the Union subtypes" message with a dump of the whole namespace. Here the error
line comes first and alone: the key, the closest valid one and how to list them all, or the constructor's own message.
"""

import importlib
import os
import re
import sys
import traceback
from difflib import get_close_matches
from typing import NoReturn

from jsonargparse import ArgumentParser
from lightning.pytorch.cli import LightningArgumentParser

# jsonargparse's messages for a key no parser accepts: from the command line, from a config file, inside a class.
UNRECOGNIZED = re.compile(r"unrecognized arguments: --?([\w.]+)")
NOT_ACCEPTED = re.compile(r"does not accept option '([\w.]+)'")
CLASS_OPTION = re.compile(
    r"Parser key \"([\w.]+)\":.*?Problem with given class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", re.S
)
# What jsonargparse 4.53 raises for a function given where a class is expected, with links into its arguments.
FUNCTION_AS_NETWORK = "unexpected keyword argument 'linked_targets'"
SHORT_USAGE_LINES = 3  # the top parser's usage; a subcommand's lists every key
# What this module reads of jsonargparse's, as its source writes it: the messages' texts above and below, and the
# attribute it reads on an error. Not an API: tests/test_boundary.py checks each is in the installed jsonargparse.
JSONARGPARSE_TEXTS = (
    "unrecognized arguments: ",
    "does not accept option '",
    'Parser key "',
    "Problem with given class_path {class_path!r}",
    "Option '{key}' is not accepted",
    "linked_targets",
    'f"Expected a {typehint}"',
    "Given value",
    ".subcommand_parser = ",
)


class ProjectArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, whose errors name their cause on one screen (``explain``)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)  # raises: a parser inside another, or jsonargparse's debug mode
        if not first_on_node():
            self.exit(2)
        parser = getattr(ex, "subcommand_parser", None) or self
        usage = parser.format_usage()
        if usage.count("\n") > SHORT_USAGE_LINES:
            usage = f"usage: {parser.prog} [--config CONFIG] [--KEY VALUE ...]\n"
        command = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"{usage}error: {explain(message, parser, command)}\n")
        self.exit(2)


def first_on_node() -> bool:
    """Whether this process says why the command line is refused: where a launcher starts every process (torchrun,
    srun), the first of each node (a node's own files may be what is wrong); the others exit 2 silently."""
    return os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) in ("", "0")


def explain(message: str, parser: ArgumentParser, command: str) -> str:
    """MESSAGE, jsonargparse's, as what went wrong and what to do: a mistyped key gets the closest valid one."""
    if match := CLASS_OPTION.search(message):
        group, class_path, option = match.groups()
        keys = class_keys(class_path)
        return unknown_key(
            f"{group}.init_args.{option}",
            [f"{group}.init_args.{key}" for key in keys],
            f"{command} --{group}.help {class_path}",
        )
    if match := UNRECOGNIZED.search(message) or NOT_ACCEPTED.search(message):
        return unknown_key(match.group(1), parser_keys(parser), f"{command} --help")
    if FUNCTION_AS_NETWORK in message:
        key = re.search(r"Parser key \"([\w.]+)\"", message)
        return (
            f"{key.group(1) if key else 'a key'}: the class path names a function (e.g. torchvision.models.resnet18),"
            " not a class taking num_classes and input_shape; for torchvision's models give --model.network"
            " project.networks.TorchvisionModel --model.network.init_args.name resnet18 (docs/data.md)"
        )
    # The rest as jsonargparse says it, less its dumps of the whole value.
    return "\n".join(line for line in message.splitlines() if not line.strip().startswith("Given value"))


def unknown_key(key: str, valid: list[str], listing: str) -> str:
    close = get_close_matches(key, [name for name in valid if name != key], n=1, cutoff=0.6)  # help text names it
    meant = f"; did you mean {close[0]}?" if close else ""
    return f"unknown key {key}{meant} ({listing} lists them)"


def parser_keys(parser: ArgumentParser) -> list[str]:
    """Every ``--key`` the parser's help lists (argparse keeps its actions private)."""
    return sorted(set(re.findall(r"--([A-Za-z_][\w.]*)", parser.format_help())))


def class_keys(class_path: str) -> list[str]:
    """The init arguments jsonargparse accepts for CLASS_PATH (following ``**kwargs`` as it does)."""
    module, _, name = class_path.rpartition(".")
    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_class_arguments(getattr(importlib.import_module(module), name), fail_untyped=False)
    except Exception:  # a class jsonargparse cannot describe: no suggestion, the listing still says where to look
        return []
    return parser_keys(parser)


def constructor_error(error: BaseException) -> str | None:
    """What a config class's constructor raised, as ``module.Class: message``, when jsonargparse wrapped it (its
    message would be a Union dump of the whole namespace); None when ERROR is not such a wrapper."""
    cause = error
    while cause.__cause__ is not None and raised_in_jsonargparse(cause):
        cause = cause.__cause__
    if cause is error:
        return None
    if str(cause).startswith("Expected a <class") and (union := union_errors(str(error))):
        return union  # a Union's first subtype (e.g. a strategy given as str) was not the one that failed
    built = next(
        (
            frame.f_locals.get("self")
            for frame, _ in traceback.walk_tb(cause.__traceback__)
            if frame.f_code.co_name == "__init__" and "jsonargparse" not in frame.f_code.co_filename
        ),
        None,
    )
    kind = "" if isinstance(cause, ValueError | TypeError) else f"{type(cause).__name__}: "
    where = f"{type(built).__module__}.{type(built).__qualname__}: " if built is not None else ""
    return f"{where}{kind}{cause}"


def union_errors(message: str) -> str | None:
    """The errors of a jsonargparse Union message, less its subtypes' "Expected a <class ...>" lines."""
    errors = [line.strip()[2:] for line in message.splitlines() if line.startswith("  - ")]
    return "; ".join(error for error in errors if not error.startswith("Expected a <class")) or None


def raised_in_jsonargparse(error: BaseException) -> bool:
    frames = list(traceback.walk_tb(error.__traceback__))
    return bool(frames) and f"{os.sep}jsonargparse{os.sep}" in frames[-1][0].f_code.co_filename
