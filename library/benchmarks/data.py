"""The data path alone: images/s of the template's data modules against plain_ddp.py's hand-written loaders on the
same files, with no model and no training loop, so that what the loaders cost is told apart from what Lightning's
loop costs (benchmarks/overhead.py races whole training runs).

    python -m benchmarks.data --batches 300 --repeats 5

Rows: the digits as PNGs (torchvision's ``ImageFolder``) and as LitData shards, 1 and 2 processes, 0 and 2 workers.
Each process is a rank of a gloo process group, as in training (LitData shards by it), and loads its own shard of
the training split epoch after epoch, the order reshuffled each epoch: the template through ``ImageFolderDataModule``
or ``StreamingDataModule``'s ``train_dataloader`` (its sampler, seeding, transforms and ``StatefulDataLoader`` or
``StreamingDataLoader``), the other side through ``plain_ddp.file_loader``. The sides alternate ``--repeats`` times;
images/s is every rank's images over the slowest rank's time from its first batch to its last.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import torch.distributed as dist

from benchmarks.overhead import REPO, child_env, digit_files
from benchmarks.plain_ddp import FILE_PIPELINES, endless, file_loader
from benchmarks.plain_ddp import parse_args as plain_args

SIDES = ("plain", "template")
SEED = 42
BATCH_SIZE = 64


def template_loader(pipeline: str, num_workers: int) -> object:
    """The template's training loader for this rank, built as the Trainer builds it."""
    from trainfleet.data import ImageFolderDataModule, StreamingDataModule

    options = {"batch_size": BATCH_SIZE, "seed": SEED, "num_workers": num_workers}
    if pipeline == "image-folder":
        data = ImageFolderDataModule(str(digit_files() / "images"), grayscale=True, **options)
    else:
        data = StreamingDataModule(str(digit_files() / "shards"), **options)
    data.setup("fit")  # no Trainer: the ranks come from the process group, the first epoch, on CPU
    return data.train_dataloader()


def template_epochs(loader: object) -> object:
    """Batches epoch after epoch, with the ``set_epoch`` call Lightning makes at each epoch start (on the loader's
    sampler and its batch sampler's sampler; written out here because Lightning's helper for it is private)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    samplers = {getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)} - {None}
    epoch = 0
    while True:
        for sampler in samplers:
            if callable(set_epoch := getattr(sampler, "set_epoch", None)):
                set_epoch(epoch)
        yield from loader
        epoch += 1


def load(side: str, pipeline: str, num_workers: int, batches: int, output: Path) -> None:
    """One rank: times ``batches`` batches after the first one and writes ``rank<N>.json``."""
    dist.init_process_group("gloo")
    if side == "template":
        batch_iter = template_epochs(template_loader(pipeline, num_workers))
    else:
        root = digit_files() / ("images" if pipeline == "image-folder" else "shards")
        args = plain_args(["--pipeline", pipeline, "--data-root", str(root), "--num-workers", str(num_workers)])
        args.seed, args.batch_size = SEED, BATCH_SIZE
        batch_iter = endless(*file_loader(args, dist.get_world_size(), dist.get_rank()))
    next(batch_iter)  # workers started, first batch in
    start, images = time.perf_counter(), 0
    for _, labels in islice(batch_iter, batches):
        images += len(labels)
    seconds = time.perf_counter() - start
    (output / f"rank{dist.get_rank()}.json").write_text(json.dumps({"seconds": seconds, "images": images}))
    dist.destroy_process_group()
    os._exit(0)  # loader workers are daemons: no join at exit


def run_side(side: str, pipeline: str, nprocs: int, num_workers: int, batches: int) -> float:
    """Images/s of one run of one side: ``nprocs`` rank processes of this script."""
    env = child_env(nprocs, threads=1)
    with tempfile.TemporaryDirectory() as output, open(Path(output) / "log", "w") as log:
        command = [sys.executable, "-m", "benchmarks.data", "--rank-of", side, pipeline, str(num_workers), str(batches)]
        command.append(output)
        ranks = {**env, "WORLD_SIZE": str(nprocs)}
        procs = [
            subprocess.Popen(command, cwd=REPO, env={**ranks, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stderr=log)
            for rank in range(nprocs)
        ]
        if any(proc.wait() for proc in procs):
            log.flush()
            errors = (Path(output) / "log").read_text()
            raise RuntimeError(f"{side} {pipeline} {nprocs}p {num_workers}w failed:\n{errors}")
        results = [json.loads((Path(output) / f"rank{rank}.json").read_text()) for rank in range(nprocs)]
    return sum(r["images"] for r in results) / max(r["seconds"] for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=300, help="timed batches per rank")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side and row (medians)")
    parser.add_argument("--only", nargs="+", metavar="ROW", help="run only these rows (e.g. image-folder-2p-0w)")
    parser.add_argument("--rank-of", nargs=5, help=argparse.SUPPRESS)  # internal: one rank of one run
    args = parser.parse_args()
    if args.rank_of:
        side, pipeline, workers, batches, output = args.rank_of
        load(side, pipeline, int(workers), int(batches), Path(output))
        return 0
    digit_files()  # written once, before any timing
    print(f"{'row':<24}{'plain images/s':>16}{'template images/s':>19}{'template / plain':>18}")
    for pipeline in FILE_PIPELINES:
        for nprocs in (1, 2):
            for workers in (0, 2):
                row = f"{pipeline}-{nprocs}p-{workers}w"
                if args.only and row not in args.only:
                    continue
                runs: dict[str, list[float]] = {side: [] for side in SIDES}
                for _ in range(args.repeats):
                    for side in SIDES:
                        runs[side].append(run_side(side, pipeline, nprocs, workers, args.batches))
                plain, template = (statistics.median(runs[side]) for side in SIDES)
                print(f"{row:<24}{plain:>16.0f}{template:>19.0f}{template / plain:>18.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
