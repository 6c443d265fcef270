"""How a rank's process ends: its process group destroyed, then an exit that skips the interpreter's finalization.

torch asks every process to destroy its group before exiting (Lightning does so only for NCCL), but gloo's threads
outlive ``destroy_process_group``: DDP's reducer keeps the group alive (torch 2.14; tests/test_process_exit.py checks
that they still run). A thread that touches Python while the interpreter finalizes aborts a run that has already
finished: "terminate called without an active exception", SIGABRT (pytorch/pytorch#179291). A CI run saw this once,
on a rank whose fit had ended. So a process that had a group ends the way a forked rank always has
(runtime/launcher.py): streams flushed, then ``os._exit``. The command's process runs its atexit handlers first,
because loggers such as wandb finish there.
"""

import atexit
import os
import sys
from typing import NoReturn

import torch.distributed as dist

_had_group = False  # set once this process destroyed a group: its threads may still run


def destroy_process_group() -> None:
    """Destroys this process's group, if it has one."""
    global _had_group
    if dist.is_initialized():
        dist.destroy_process_group()
        _had_group = True


def exit_code(stop: SystemExit) -> int:
    """The status that ``sys.exit(CODE)`` ends a process with: CODE, 0 for None, and 1 for a message (printed)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def exit_now(code: int) -> NoReturn:
    """Ends this process at once, what it printed flushed: no thread can run during a finalization."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def end(stop: SystemExit) -> NoReturn:
    """Ends the command's process as STOP would. After a process group, first the atexit handlers, then exit_now."""
    if not _had_group:
        raise stop
    atexit._run_exitfuncs()  # what the interpreter's exit runs first (CPython's, undocumented): loggers finish there
    exit_now(exit_code(stop))
