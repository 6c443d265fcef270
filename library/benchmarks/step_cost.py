"""What a training step costs in Lightning and what the template adds to it, told apart in one process.

    python -m benchmarks.step_cost --steps 1100 --repeats 7

Alternately, in this one process and on one thread, on the digits MLP with in-memory batches (benchmarks/overhead.py's
``cpu-in-memory-1p`` row): ``bare``, the bare Lightning Trainer (benchmarks/bare_lightning.py), and ``template``, the
Trainer, module, data and callbacks ``python -m project fit`` builds (its CLI, with the benchmark's flags). Each
side's figure is the median time between two steps' starts after 100 warm-up steps (a median, so a shared machine's
one-off stalls do not count), and the sides' medians over ``--repeats``. ``template`` minus ``bare`` is what the
template's own work costs a step.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from benchmarks.bare_lightning import fit as bare_fit
from benchmarks.overhead import REPO, Config, free_port, launches
from benchmarks.plain_ddp import parse_args as plain_args
from trainfleet.cli import build_cli

WARM_UP_STEPS = 100
SIDES = ("bare", "template")


class StepStarts(Callback):
    """The median time between two steps' starts, after the warm-up."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.median_s = 0.0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int) -> None:
        if trainer.global_step >= WARM_UP_STEPS:
            self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.median_s = statistics.median(b - a for a, b in zip(self.starts, self.starts[1:], strict=False))


def run(side: str, steps: int, workdir: Path) -> float:
    """One fit of SIDE; its median step in seconds."""
    timer = StepStarts()
    if side == "template":
        ((command, _),) = launches("template", Config("cpu", "in-memory", 1, 64, steps), workdir)
        args = [arg for arg in command[4:] if not arg.startswith("--trainer.callbacks")]  # after "-m project fit"
        cli = build_cli(args, run=False)
        cli.trainer.callbacks.append(timer)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    else:
        bare_fit(plain_args(["--steps", str(steps), "--pipeline", "in-memory"]), 1, [timer])
    return timer.median_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1100, help="steps per fit, the warm-up's 100 included")
    parser.add_argument("--repeats", type=int, default=7, help="fits per side (medians)")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))  # the template's group of one
    sys.argv = sys.argv[:1]  # the CLI reads its arguments from run(), not from this command line
    os.chdir(REPO)  # the benchmark's flags name configs/ relative to it
    runs: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for side in SIDES:
                runs[side].append(run(side, args.steps, Path(workdir) / f"{side}-{repeat}"))
    medians = {side: statistics.median(runs[side]) * 1e6 for side in SIDES}
    for side in SIDES:
        singles = ", ".join(f"{seconds * 1e6:.0f}" for seconds in runs[side])
        ratio = medians["bare"] / medians[side]
        print(f"{side:<10} {medians[side]:7.1f} us/step  x{ratio:.3f} bare steps/s  (runs: {singles})")
    print(f"the template's own work: {medians['template'] - medians['bare']:.1f} us/step")


if __name__ == "__main__":
    main()
