"""Where a restart's time goes: ``scripts/torchrun.sh`` (2 workers, ``--ckpt_path auto``) with rank 1 SIGKILLed (a
crash) or SIGSTOPped (a hang, named at the process-group timeout) mid-run, and the restarted run's timeline, from the
fault to its first training step: the rank's new process (forked by its supervisor: runtime/warm_restart.py), the
config and objects, the process group, the checkpoint load, the first step. Each fault kind REPEATS times, medians.
``--cold`` adds, alternating with it, torchrun's own restart (``--max-restarts``: new interpreters) of the same run.

    python -m benchmarks.recovery --repeats 3 [--cold]
"""

import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from benchmarks.first_step import LIBRARY, REPO
from trainfleet.runs.folders import restart_count

TIMELINE = "RECOVERY_TIMELINE"  # a file each rank appends "attempt rank phase time" to
FAULT_STEP = 30
PHASES = ("fault", "process", "built", "setup", "train_start", "first_step")
SPANS = {  # the span ending at each phase: what it covers
    "process": "fault to the new process (detection; the supervisors' fork, or torchrun's restart)",
    "built": "imports (a new interpreter only), config, objects",
    "setup": "process group",
    "train_start": "checkpoint load, strategy set-up",
    "first_step": "first training step",
}


def process_start_time() -> float:
    """This process's start, in seconds since the epoch (/proc: clock ticks since boot, on the boot-time clock)."""
    ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
    running = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - running


class Timeline(Callback):
    """Appends each phase's time to the file ``RECOVERY_TIMELINE`` names; in the first attempt, rank 1 ends with
    FAULT at step ``FAULT_STEP`` (``sigkill``: a crash; ``sigstop``: a hang)."""

    def __init__(self, fault: str = "sigkill") -> None:
        self.fault, self.attempt = fault, restart_count()
        self.first_step_done, self.built = False, time.time()

    def record(self, rank: int, phase: str, when: float | None = None) -> None:
        with open(os.environ[TIMELINE], "a") as file:
            file.write(f"{self.attempt} {rank} {phase} {when if when is not None else time.time():.3f}\n")

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.record(trainer.global_rank, "process", process_start_time())
        self.record(trainer.global_rank, "built", self.built)
        self.record(trainer.global_rank, "setup")

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record(trainer.global_rank, "train_start")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if not self.first_step_done:
            self.first_step_done = True
            self.record(trainer.global_rank, "first_step")
        if self.attempt == 0 and trainer.global_rank == 1 and trainer.global_step == FAULT_STEP:
            self.record(1, "fault")
            os.kill(os.getpid(), getattr(signal, self.fault.upper()))


def restart(fault: str, timeout_s: int, cold: bool = False) -> dict[str, float]:
    """One run with FAULT (restarted by torchrun itself if COLD); seconds from the fault to each phase of rank 0's
    restarted attempt."""
    with tempfile.TemporaryDirectory() as root:
        timeline = Path(root) / "timeline.txt"
        env = {**os.environ, TIMELINE: str(timeline), "DEVICES": "2", "MAX_RESTARTS": "1", "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = str(LIBRARY)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the launcher calls torchrun
        flags = [
            "--config=configs/digits.yaml",
            f"--trainer.default_root_dir={root}/run",
            "--trainer.max_steps=60",
            "--trainer.max_epochs=-1",
            "--trainer.enable_progress_bar=false",
            "--trainer.num_sanity_val_steps=0",
            "--checkpoint.every_n_train_steps=10",
            f"--trainer.strategy.init_args.timeout=0:00:{timeout_s:02d}",
            "--ckpt_path=auto",
            "--trainer.callbacks+=benchmarks.recovery.Timeline",
            f"--trainer.callbacks.fault={fault}",
        ]
        command = ["bash", "scripts/torchrun.sh", *flags]
        if cold:  # what scripts/torchrun.sh ran before its restarts were warm
            port = ["--master-addr", "127.0.0.1", "--master-port", env.get("MASTER_PORT", "29500"), "--node-rank", "0"]
            command = ["torchrun", "--nnodes", "1", "--nproc-per-node", "2", *port, "--max-restarts", "1"]
            command += ["-m", "project", "fit", *flags, "--trainer.devices", "2"]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        times = {}
        for line in timeline.read_text().splitlines():
            attempt, rank, phase, when = line.split()
            if phase == "fault" or (attempt, rank) == ("1", "0"):
                times[phase] = float(when)
    return {phase: times[phase] - times["fault"] for phase in PHASES[1:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=10, help="the process-group timeout, seconds (the hang)")
    parser.add_argument("--cold", action="store_true", help="also torchrun's own restarts, alternating")
    args = parser.parse_args()
    faults = {"crash (SIGKILL of rank 1)": "sigkill", f"hang (SIGSTOP of rank 1, {args.timeout} s timeout)": "sigstop"}
    ways = {"warm": False, "cold": True} if args.cold else {"": False}
    columns = {
        f"{name}{f', {way}' if way else ''}": (fault, cold)
        for name, fault in faults.items()
        for way, cold in ways.items()
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in columns}
    for _ in range(args.repeats):  # alternating
        for name, (fault, cold) in columns.items():
            runs[name].append(restart(fault, args.timeout, cold))
    command = f"python -m benchmarks.recovery --repeats {args.repeats}{' --cold' if args.cold else ''}"
    print(f"`{command}`: seconds, medians of {args.repeats}\n")
    print("| span | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for previous, phase in itertools.pairwise(PHASES):
        spans = [statistics.median(run[phase] - run.get(previous, 0.0) for run in runs[name]) for name in columns]
        print(f"| {SPANS[phase]} | " + " | ".join(f"{span:.2f}" for span in spans) + " |")
    totals = [statistics.median(run["first_step"] for run in runs[name]) for name in columns]
    print("| **fault to the first step** | " + " | ".join(f"**{total:.2f}**" for total in totals) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
