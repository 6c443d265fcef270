"""The per-step cost ledger: what each of the template's per-step parts costs a training step, each told apart by
switching it alone off (or on), on 1 and 2 processes.

    python -m benchmarks.ledger --nprocs 1 2 --steps 400 --rounds 5 --write docs/performance.md
    python -m benchmarks.ledger --parts slow-rank --rounds 15      # one part, more rounds: a finer median

On the digits MLP with in-memory batches and one thread per process (benchmarks/overhead.py's
``cpu-in-memory-*`` rows, whose template flags it takes: no logger, progress bar, scheduler or checkpoint
files), every process runs, in one process group and alternately, round after round (each round in another
order): ``bare`` (bare Lightning, benchmarks/bare_lightning.py), ``peer`` (the peer pattern,
benchmarks/peer_pattern.py), ``template`` (the Trainer, module, data and callbacks ``python -m project fit``
builds), and the template with one part switched off (removed, or its per-step hook made a no-op) or on (``+``:
a default the benchmark's template leaves off). A side's figure is its fit's time per step after the warm-up
(``StepWindow``: epoch ends included), median over the rounds; a part's is the median over the rounds of its
fit's difference from the template's fit of the same round (removing it: the template's minus the variant's).
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from benchmarks.bare_lightning import BareModule
from benchmarks.bare_lightning import fit as bare_fit
from benchmarks.overhead import REPO, RUN_TIMEOUT_S, Config, child_env, launches, wait_all
from benchmarks.peer_pattern import PeerModule
from benchmarks.plain_ddp import parse_args as plain_args
from trainfleet.checkpoints.resume_state import ResumeState
from trainfleet.cli import ProjectCLI, build_cli
from trainfleet.runs.outputs import PredictionsWriter, TestMetricsWriter
from trainfleet.runtime.faults import FailFast
from trainfleet.runtime.nan_guard import NaNGuard
from trainfleet.runtime.preemption import PreemptionCheck
from trainfleet.runtime.throughput import Throughput

WARM_UP_STEPS = 100
MARKERS = ("<!-- ledger: start -->", "<!-- ledger: end -->")  # docs/performance.md's table, rewritten by --write


class StepWindow(Callback):
    """A robust time per step after the warm-up, epoch ends included: the median interval between two steps' starts
    inside an epoch, plus the median extra of an interval spanning an epoch's end spread over the epoch's steps
    (medians: a shared machine's one-off stalls do not count, as a mean's would)."""

    def __init__(self) -> None:
        self.starts: list[tuple[float, bool]] = []  # (time, whether the step is an epoch's first)
        self.seconds_per_step = 0.0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int) -> None:
        if trainer.global_step >= WARM_UP_STEPS:
            self.starts.append((time.perf_counter(), batch_idx == 0))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pairs = zip(self.starts, self.starts[1:], strict=False)
        intervals = [(end - start, first) for (start, _), (end, first) in pairs]
        within = statistics.median(seconds for seconds, first in intervals if not first)
        across = statistics.median(seconds for seconds, first in intervals if first)
        self.seconds_per_step = within + (across - within) / trainer.num_training_batches


def drop(kind: type | tuple[type, ...]) -> Callable[[ProjectCLI], None]:
    def change(cli: ProjectCLI) -> None:
        cli.trainer.callbacks[:] = [callback for callback in cli.trainer.callbacks if not isinstance(callback, kind)]

    return change


def quiet_preemption_check(cli: ProjectCLI) -> None:
    """Its per-step hook (the step count, the flags' all-reduce every ``check_every_n_steps``) a no-op; its signal
    handling, which turns Lightning's per-step SIGTERM broadcast off, kept."""
    check = next(callback for callback in cli.trainer.callbacks if isinstance(callback, PreemptionCheck))
    check.on_train_batch_end = lambda *args: None


def no_step_times(cli: ProjectCLI) -> None:
    """The slow-rank clock off (runtime/slow_rank.py): the check's hooks that only read it are ``Callback``'s empty
    ones again (skipped, as idle hooks are), and its step end only checks; its slot in the exchange stays."""
    check = next(callback for callback in cli.trainer.callbacks if isinstance(callback, PreemptionCheck))
    for hook in ("on_train_epoch_start", "on_train_batch_start", "on_before_backward"):
        setattr(check, hook, getattr(Callback, hook).__get__(check))
    check.on_train_batch_end = lambda trainer, *args: check.after_step(trainer)


def no_training_metrics(cli: ProjectCLI) -> None:
    """No training loss or accuracy: neither their per-step updates nor their epoch-end sync and logging."""
    model = cli.model
    model.updates["train"].add = lambda *args: None
    model.on_train_epoch_end = lambda: None


@dataclass(frozen=True)
class Part:
    name: str
    off: bool  # True: the template without it; False: the template with it (the benchmark's template has it off)
    flags: dict[str, str | None] = field(default_factory=dict)  # None drops the benchmark's flag: the config's default
    change: Callable[[ProjectCLI], None] | None = None


PARTS = (
    Part("FailFast (heartbeat)", True, change=drop(FailFast)),
    Part("NaNGuard", True, change=drop(NaNGuard)),
    Part("Throughput", True, change=drop(Throughput)),
    Part("ResumeState", True, change=drop(ResumeState)),
    Part("PreemptionCheck, its step check", True, change=quiet_preemption_check),
    Part("PreemptionCheck, its slow-rank clock", True, change=no_step_times),
    Part("PreemptionCheck, whole (without it: Lightning's SIGTERM broadcast)", True, change=drop(PreemptionCheck)),
    Part("ModelCheckpoint (saving nothing)", True, change=drop(ModelCheckpoint)),
    Part("training metrics (torchmetrics)", True, change=no_training_metrics),
    Part("+ scheduler (WarmupCosineLR, per step)", False, flags={"model.scheduler": None}),
    Part("+ PeriodicCheckpoint (periodic.every 1 h)", False, flags={"periodic.every": "1:00:00"}),
    Part("+ progress bar", False, flags={"trainer.enable_progress_bar": None}),
    Part("+ CSV logger", False, flags={"trainer.logger": None}),
)
SIDES = ("bare", "peer", "template")


def template_flags(nprocs: int, steps: int, workdir: Path) -> dict[str, str]:
    """benchmarks/overhead.py's flags for the template's ``cpu-in-memory-{nprocs}p`` row, without its timer."""
    ((command, _),) = launches("template", Config("cpu", "in-memory", nprocs, 64, steps), workdir)
    pairs = (arg[2:].split("=", 1) for arg in command[4:])  # after "-m project fit"
    return {key: value for key, value in pairs if not key.startswith("trainer.callbacks")}


def fit(name: str, nprocs: int, steps: int, workdir: Path) -> float:
    """One fit of side or part NAME; its seconds per step after the warm-up (``StepWindow``)."""
    window = StepWindow()
    if name in ("bare", "peer"):
        args = plain_args(["--steps", str(steps), "--pipeline", "in-memory"])
        bare_fit(args, nprocs, [window], PeerModule if name == "peer" else BareModule)
        return window.seconds_per_step
    part = next((part for part in PARTS if part.name == name), Part("template", True))
    flags = {**template_flags(nprocs, steps, workdir), **part.flags}
    cli = build_cli([f"--{key}={value}" for key, value in flags.items() if value is not None], run=False)
    drop((TestMetricsWriter, PredictionsWriter))(cli)  # built for run=False's every subcommand: not a fit's
    if part.change:
        part.change(cli)
    cli.trainer.callbacks.append(window)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return window.seconds_per_step


def work(args: argparse.Namespace) -> None:
    """One rank's rounds (every rank runs the same fits in the same order); rank 0 writes the times."""
    os.chdir(REPO)  # the benchmark's flags name configs/ relative to it
    sys.argv = sys.argv[:1]  # the CLI reads its arguments from fit(), not from this command line
    names = [*SIDES, *(part.name for part in chosen_parts(args))]
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        turn = round_ * len(names) // args.rounds  # each round starts elsewhere: no fit always follows the same one
        for name in names[turn:] + names[:turn]:
            gc.collect()  # the previous fits' garbage is not collected inside this one's steps
            times[name].append(fit(name, args.nprocs, args.steps, Path(args.workdir) / f"{round_}-{names.index(name)}"))
    if os.environ["RANK"] == "0":
        Path(args.output).write_text(json.dumps(times))
    if dist.is_initialized():  # left to the interpreter's exit, a rank aborted once ("terminate called ...")
        dist.destroy_process_group()


def run_ranks(nprocs: int, args: argparse.Namespace, workdir: Path) -> dict[str, list[float]]:
    """Starts NPROCS worker processes (each one rank of a group that stays up across the fits); rank 0's times."""
    env = child_env(nprocs, threads=1)
    env.update(WORLD_SIZE=str(nprocs), NODE_RANK="0")
    output = workdir / f"times-{nprocs}p.json"
    command = [sys.executable, "-m", "benchmarks.ledger", "--worker", "--nprocs", str(nprocs)]
    command += ["--steps", str(args.steps), "--rounds", str(args.rounds), "--output", str(output)]
    command += ["--workdir", str(workdir / f"{nprocs}p")] + (["--sides-only"] if args.sides_only else [])
    command += ["--parts", *args.parts] if args.parts else []
    log_path = workdir / f"{nprocs}p.log"
    with open(log_path, "w") as log:
        procs = [
            subprocess.Popen(
                command, cwd=REPO, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=log, stderr=log
            )
            for rank in range(nprocs)
        ]
        codes = wait_all(procs, RUN_TIMEOUT_S * args.rounds)
    if any(codes):
        sys.exit(f"the {nprocs}-process ledger exited {codes}:\n{log_path.read_text()[-4000:]}")
    return json.loads(output.read_text())


def chosen_parts(args: argparse.Namespace) -> list[Part]:
    """Every part, none (``--sides-only``), or those whose names hold one of ``--parts``' words."""
    if args.sides_only:
        return []
    return [part for part in PARTS if not args.parts or any(word in part.name for word in args.parts)]


def measured(found: dict[str, object]) -> list[Part]:
    """The parts FOUND has figures for: none after ``--sides-only``."""
    return [part for part in PARTS if part.name in found]


def summary(times: dict[str, list[float]]) -> dict[str, float]:
    """Microseconds per step of each side (medians), the template's speed against the others' (medians of each
    round's ratio: a shared machine's speed drifts between rounds more than between neighbouring fits), and each
    part's microseconds (medians of each round's paired difference)."""
    found = {side: statistics.median(times[side]) * 1e6 for side in SIDES}
    for side in ("bare", "peer"):
        found[f"template / {side}"] = statistics.median(
            other / ours for ours, other in zip(times["template"], times[side], strict=True)
        )
    for part in measured(times):
        pairs = zip(times["template"], times[part.name], strict=True)
        differences = ((ours - other if part.off else other - ours) * 1e6 for ours, other in pairs)
        found[part.name] = statistics.median(differences)
    return found


def table(results: dict[int, dict[str, float]], command: str) -> str:
    counts = sorted(results)
    head = "| per step | " + " | ".join(f"{n} process{'es' if n > 1 else ''}" for n in counts) + " |"
    lines = [f"`{command}`", "", head, "| --- |" + " --- |" * len(counts)]

    def row(label: str, cell: Callable[[dict[str, float]], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(results[n]) for n in counts) + " |")

    row("bare Lightning, µs", lambda r: f"{r['bare']:.0f}")
    row("peer pattern (torchmetrics, `self.log` every step), µs", lambda r: f"{r['peer']:.0f}")
    row("template, every default on, µs", lambda r: f"{r['template']:.0f}")
    row("template / bare, steps/s", lambda r: f"{r['template / bare']:.2f}")
    row("template / peer pattern, steps/s", lambda r: f"{r['template / peer']:.2f}")
    row("the template's own work (template - bare), µs", lambda r: f"{r['template'] - r['bare']:.0f}")
    for part in measured(results[counts[0]]):
        row(f"{part.name}, µs", lambda r, name=part.name: f"{r[name]:.0f}")
    return "\n".join(lines)


def write_into(path: Path, text: str) -> None:
    """Replaces what stands between the ledger's markers in PATH."""
    doc = path.read_text()
    start, end = (doc.index(marker) for marker in MARKERS)
    path.write_text(doc[: start + len(MARKERS[0])] + "\n" + text + "\n" + doc[end:])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[1, 2], help="process counts, one ledger each")
    parser.add_argument("--steps", type=int, default=400, help=f"steps per fit, the warm-up's {WARM_UP_STEPS} included")
    parser.add_argument("--rounds", type=int, default=5, help="fits of each side and part (medians)")
    parser.add_argument("--sides-only", action="store_true", help="bare, peer and template alone: their ratios sooner")
    parser.add_argument("--parts", nargs="+", metavar="WORDS", help="only the parts whose names hold these words")
    parser.add_argument("--write", metavar="DOC", help="write the table between the ledger's markers in DOC")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps <= WARM_UP_STEPS:
        parser.error(f"--steps must be above the warm-up's {WARM_UP_STEPS}")
    if unmatched := [word for word in args.parts or [] if not any(word in part.name for part in PARTS)]:
        parser.error(f"--parts: no part's name holds {', '.join(unmatched)}")
    if args.write and (args.parts or args.sides_only):
        parser.error("--write rewrites the whole ledger: measure every part (no --parts, no --sides-only)")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        args.nprocs = args.nprocs[0]
        work(args)
        return
    command = "python -m benchmarks.ledger " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory() as workdir:
        results = {n: summary(run_ranks(n, args, Path(workdir))) for n in args.nprocs}
    text = table(results, command)
    print(text)
    if args.write:
        write_into(Path(args.write), text)


if __name__ == "__main__":
    main()
