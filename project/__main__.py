"""``python -m project COMMAND``: the Lightning commands (fit, validate, test, predict: cli.py), ``doctor``
(runtime/doctor.py), ``sweep`` (runs/sweep.py) and ``consolidate SHARDED_CHECKPOINT OUTPUT`` (runs/checkpointing.py).

The rest is imported inside ``main``, after SLURM's requeue signal is caught: importing torch takes seconds on a busy
node, and SLURM may send the signal that early (runtime/requeue_signal.py).
"""

import argparse
import sys
from pathlib import Path

from project.runtime.requeue_signal import EarlyRequeueSignal


def main(args: list[str] | None = None) -> None:
    EarlyRequeueSignal.catch()
    import torch.distributed as dist

    from project.cli import build_cli
    from project.runs.folders import program_name
    from project.runtime import doctor, restarts
    from project.runtime.lightning_internals import LightningMismatch, silence_known_noise

    doctor.apply_debug_switch()
    silence_known_noise()
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["doctor"]:
        sys.exit(doctor.main(argv[1:]))
    if argv[:1] == ["sweep"]:
        from project.runs import sweep  # Optuna is an optional extra

        sys.exit(sweep.main(argv[1:]))
    if argv[:1] == ["consolidate"]:
        sys.exit(consolidate(argv[1:]))
    try:
        build_cli(args, prog=program_name(sys.argv[0]))
    except LightningMismatch as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(restarts.REFUSED_EXIT_CODE)
    except FloatingPointError:  # the NaN guard, already reported and recorded (runtime/guard.py): never restarted
        sys.exit(restarts.DETERMINISTIC_EXIT_CODE)
    except SystemExit as error:
        restarts.record_exit(error)
        raise
    finally:
        # torch asks every process to destroy its group before exiting; Lightning does so only for NCCL. Left to the
        # interpreter's exit, gloo's threads can abort it (pytorch/pytorch#190489).
        if dist.is_initialized():
            dist.destroy_process_group()


def consolidate(argv: list[str]) -> int:
    """A sharded (FSDP2) checkpoint as one file, for export or a run without FSDP."""
    from project.runs import checkpointing

    parser = argparse.ArgumentParser(prog="python -m project consolidate", description=consolidate.__doc__)
    parser.add_argument("checkpoint", type=Path, help="a sharded checkpoint's folder, e.g. .../checkpoints/last.ckpt")
    parser.add_argument("output", type=Path, help="the single-file checkpoint to write")
    args = parser.parse_args(argv)
    if not checkpointing.is_sharded(args.checkpoint):
        parser.error(f"{args.checkpoint} is not a sharded checkpoint's folder (with a .metadata file)")
    try:
        checkpointing.consolidate(args.checkpoint, args.output)
    except checkpointing.CheckpointError as error:
        parser.error(str(error))
    print(f"{args.checkpoint} consolidated into {args.output}")
    return 0


if __name__ == "__main__":
    main()
