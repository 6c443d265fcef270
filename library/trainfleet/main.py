"""``python -m PACKAGE COMMAND``, a project's one entry point (its ``__main__`` calls ``run``): Lightning's commands
(``fit``, ``validate``, ``test``, ``predict``: cli.py) and the library's own (``COMMANDS``, in commands/).

The rest is imported inside ``main``, after SLURM's requeue signal and Ctrl-C are caught: importing torch takes
seconds on a busy node, and SLURM may send the signal that early (runtime/requeue_signal.py, early_interrupt.py).
"""

import importlib
import sys
import time

from trainfleet import program
from trainfleet.runtime.early_interrupt import EarlyInterrupt
from trainfleet.runtime.requeue_signal import EarlyRequeueSignal

# The template's commands: module (with a ``main(argv) -> exit code``) and what it does, for --help.
COMMANDS = {
    "doctor": (
        "trainfleet.commands.doctor",
        "the distributed setup; launched like training, all-reduce checked and timed on every rank",
    ),
    "sweep": ("trainfleet.commands.sweep", "an Optuna hyperparameter sweep of real fits (the sweep extra)"),
    "consolidate": ("trainfleet.commands.consolidate", "a sharded (FSDP2) checkpoint as one file"),
    "report": ("trainfleet.commands.report", "what a run lost (its goodput record): a table and a timeline PNG"),
}


def main(args: list[str] | None = None) -> None:
    started = time.time()  # before the imports below: a run's wall time includes its start-up (runs/goodput.py)
    EarlyRequeueSignal.catch()
    argv = sys.argv[1:] if args is None else args
    command = argv[0] if argv[:1] and argv[0] in COMMANDS else None
    if command is None:  # Lightning's commands; the template's own handle Ctrl-C themselves
        EarlyInterrupt.catch()
    from trainfleet import exit_codes
    from trainfleet.cli import build_cli
    from trainfleet.commands.doctor import apply_debug_switch
    from trainfleet.lightning_internals import LightningMismatch
    from trainfleet.runs import goodput, lock, restarts
    from trainfleet.runs.folders import program_name
    from trainfleet.runs.lock import RunFolderHeld
    from trainfleet.runtime import warm_restart
    from trainfleet.runtime.known_noise import silence_known_noise
    from trainfleet.runtime.process_exit import destroy_process_group
    from trainfleet.runtime.rendezvous import StartupFailed

    apply_debug_switch()
    silence_known_noise()
    prog = program_name(sys.argv[0])
    try:
        if warm_restart.requested(argv):
            warm_restart.supervise()  # returns in each attempt's rank; the supervisor ends its process
            if restarts.warm_generation() > 0:  # a restart's rank, forked just now (the first one, at the start)
                started = time.time()
        goodput.attempt_started(started)
        if command is not None:
            sys.exit(importlib.import_module(COMMANDS[command][0]).main(argv[1:]))
        epilog = "; ".join(f"{name}: {help}" for name, (_, help) in COMMANDS.items())
        epilog = f"The template's own commands ({prog} COMMAND --help for each): {epilog}."
        build_cli(args, prog=prog, epilog=epilog)
    except LightningMismatch as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(exit_codes.REFUSED_EXIT_CODE)
    except RunFolderHeld as error:  # only the run's owner checks (runs/lock.py): one line, not a usage error
        print(f"error: {error}", file=sys.stderr)
        restarts.record_outcome(exit_codes.REFUSED_EXIT_CODE, str(error))
        sys.exit(exit_codes.REFUSED_EXIT_CODE)
    except StartupFailed as error:  # the ranks could not meet: already reported (runtime/rendezvous.py)
        restarts.record_outcome(error.exit_code, str(error))
        sys.exit(error.exit_code)
    except FloatingPointError:  # the NaN guard, already reported and recorded (runtime/nan_guard.py): never restarted
        sys.exit(exit_codes.DETERMINISTIC_EXIT_CODE)
    except OSError as error:  # a full disk, reported and recorded by FailFast (runtime/faults.py): never restarted
        if not exit_codes.is_disk_full(error):
            raise
        sys.exit(exit_codes.DISK_FULL_EXIT_CODE)
    except SystemExit as error:
        restarts.record_exit(error)
        raise
    finally:
        EarlyInterrupt.disarm()
        destroy_process_group()
        lock.release()  # the run folder, for the next fit on it (a process that dies releases it too)


def run(package: str, module_class: str) -> None:
    """The process's entry point (a project's ``python -m PACKAGE`` and console script), for the project PACKAGE whose
    LightningModule is MODULE_CLASS (a class path): ``main``, then the process's end (runtime/process_exit.py: after a
    process group, without the interpreter's finalization)."""
    program.serve(package, module_class)
    stop = SystemExit(0)
    try:
        main()
    except SystemExit as raised:
        stop = raised
    except Exception:  # a crash: its traceback (in a file, once training started: runs/failures.py), exit code 1
        from trainfleet.runs.failures import report_crash

        report_crash(*sys.exc_info())
        stop = SystemExit(1)
    from trainfleet.runtime import process_exit

    process_exit.end(stop)
