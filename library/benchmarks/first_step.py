"""Time to first step of ``python -m project fit`` on 2 processes, this checkout against another one (a git
worktree of an earlier commit), alternating, medians: did the template's own start-up grow? From the launch to rank
0's first training step, as benchmarks/overhead.py's "1st step s" column, without the hand-written and bare sides.

    git worktree add /tmp/before 0ade1a1
    python -m benchmarks.first_step --other /tmp/before --repeats 5 -- --model.network project.networks.SmallCNN
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

REPO = Path(__file__).resolve().parents[2]  # the template: its configs and its project
LIBRARY = REPO / "library"
LAUNCH_TIME = "FIRST_STEP_LAUNCH_TIME"
FLAGS = (
    "--config=configs/digits.yaml",
    "--trainer.devices=2",
    "--trainer.max_steps=3",
    "--trainer.max_epochs=-1",
    "--trainer.limit_val_batches=0",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--checkpoint.save_top_k=0",
    "--checkpoint.save_last=false",
    "--trainer.callbacks+=benchmarks.first_step.FirstStep",
)


class FirstStep(Callback):
    """Prints the seconds from the launch to rank 0's first training step."""

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == 0 and trainer.global_rank == 0:
            print(f"first step {time.time() - float(os.environ[LAUNCH_TIME]):.3f}", flush=True)


def first_step(tree: Path, extra: list[str]) -> float:
    """One fit from TREE (its ``project`` package, this checkout's ``benchmarks``); seconds to its first step."""
    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "library"), str(LIBRARY)])}
        env["OMP_NUM_THREADS"] = "1"
        env[LAUNCH_TIME] = str(time.time())
        command = [sys.executable, "-m", "project", "fit", *FLAGS, f"--trainer.default_root_dir={root}", *extra]
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return float(next(line for line in done.stdout.splitlines() if line.startswith("first step")).split()[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", type=Path, required=True, help="another checkout of the project (git worktree)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="more fit flags, after --")
    args = parser.parse_args()
    trees = {"this": REPO, "other": args.other.resolve()}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            times[name].append(first_step(tree, args.extra))
    for name, values in times.items():
        runs = ", ".join(f"{value:.2f}" for value in values)
        print(f"{name:>5} {trees[name]}: median {statistics.median(values):.2f} s ({runs})")
    print(f"this - other: {statistics.median(times['this']) - statistics.median(times['other']):+.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
