"""``python -m project COMMAND``: the Lightning commands (fit, validate, test, predict: cli.py), ``doctor``
(runtime/doctor.py) and ``sweep`` (runs/sweep.py)."""

import sys

import torch.distributed as dist

from project.cli import build_cli, program_name
from project.runtime import doctor
from project.runtime.lightning_internals import LightningMismatch, silence_known_noise


def main(args: list[str] | None = None) -> None:
    doctor.apply_debug_switch()
    silence_known_noise()
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["doctor"]:
        sys.exit(doctor.main(argv[1:]))
    if argv[:1] == ["sweep"]:
        from project.runs import sweep  # Optuna is an optional extra

        sys.exit(sweep.main(argv[1:]))
    try:
        build_cli(args, prog=program_name(sys.argv[0]))
    except LightningMismatch as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    finally:
        # torch asks every process to destroy its group before exiting; Lightning does so only for NCCL. Left to the
        # interpreter's exit, gloo's threads can abort it (pytorch/pytorch#190489).
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
