"""``python -m project consolidate SHARDED_CHECKPOINT OUTPUT``: a sharded (FSDP2) checkpoint as one file, for
export or a run without FSDP."""

import argparse
from pathlib import Path

from trainfleet.checkpoints import files as checkpoint_files


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m project consolidate", description=__doc__.split(": ", 1)[1])
    parser.add_argument("checkpoint", type=Path, help="a sharded checkpoint's folder, e.g. .../checkpoints/last.ckpt")
    parser.add_argument("output", type=Path, help="the single-file checkpoint to write")
    args = parser.parse_args(argv)
    if not checkpoint_files.is_sharded(args.checkpoint):
        parser.error(f"{args.checkpoint} is not a sharded checkpoint's folder (with a .metadata file)")
    try:
        checkpoint_files.consolidate(args.checkpoint, args.output)
    except checkpoint_files.CheckpointError as error:
        parser.error(str(error))
    print(f"{args.checkpoint} consolidated into {args.output}")
    return 0
