"""What a run lost, in one place: the goodput record, ``goodput.jsonl`` in the run folder.

A run's time goes to training, and to what is not: start-up, data waits, validation, checkpoint saves, and restarts
(the failure's detection, the next attempt's set-up, the steps trained again from an older checkpoint). Each attempt
of a run (its first start, each restart, each resume into its folder) appends one JSON line when it ends, written by
global rank 0 in one write: a crash mid-write leaves the earlier lines whole, and a torn last line is skipped when
read (``read_records``). ``summarize`` turns the lines into the run's figures; the fit's last line says them
(``say_goodput``), and ``python -m project report RUN_FOLDER`` shows them as a table and a timeline
(commands/report.py).

The timing is rank 0's, from the hooks of ``Goodput``: a step is the time between its ``on_train_batch_start`` and
``on_train_batch_end`` (``time.perf_counter`` only: no collective, no host sync), a checkpoint stall the time the
checkpoint IO blocked the caller (``AtomicCheckpointIO.stalls``, checkpoints/files.py), a restart's failure and the
moment it was known come from the warm-restart supervisors (runtime/warm_restart.py), through the environment, and
the slow ranks from the preemption check's exchanges (runtime/slow_rank.py).
"""

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from trainfleet.messages import first_line, report
from trainfleet.runs import restarts
from trainfleet.runs.summary import run_folder

GOODPUT_FILE = "goodput.jsonl"
SOURCE_LOCATION = re.compile(r"\[/[^\]\s]+:\d+\] ")
CAUSE_CHARS = 60  # of a restart's cause in the fit's last line (the report shows it whole)

_attempt_started: float | None = None  # set by the entry point, before its imports (``attempt_started``)


def attempt_started(at: float) -> None:
    """When this attempt began (``time.time()``): the command's start, or a warm restart's fork of its rank."""
    global _attempt_started
    _attempt_started = at


def _take_attempt_start() -> float:
    """This attempt's start, taken once: a later Trainer of the same process (a test's, a benchmark's) starts now."""
    global _attempt_started
    started, _attempt_started = _attempt_started or time.time(), None
    return started


class Goodput(Callback):
    """Times rank 0's attempt and appends its line to the run's ``goodput.jsonl`` when it ends (finished, failed or
    stopped). First of the callbacks (cli.py), so that a step's time stops before the other callbacks' end-of-step
    work (the checkpoint saves, counted as stalls), and its line is written before ``FailFast`` stops the ranks."""

    def __init__(self, restart: tuple[str, str] | None = None) -> None:
        """RESTART: the restart this attempt is, (what, cause) as ``restarts.txt`` counted it (runs/folders.py)."""
        self.restart = restart
        self.started = _take_attempt_start()
        self.training_s = 0.0
        self.first_step_at: float | None = None
        self.start_step: int | None = None  # None until training starts: an attempt that never trained writes nothing
        self.stalls_before = 0
        self._step_began = 0.0

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.start_step = trainer.global_step
        self.stalls_before = len(checkpoint_stalls(trainer))

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._step_began = time.perf_counter()
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.training_s += time.perf_counter() - self._step_began

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write(trainer, "finished")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        stopped = isinstance(exception, (SystemExit, KeyboardInterrupt))  # preemption, Ctrl-C: saved and stopped
        self._write(trainer, "stopped" if stopped else f"failed: {type(exception).__name__}")

    def _write(self, trainer: Trainer, outcome: str) -> None:
        if not trainer.is_global_zero or self.start_step is None:
            return
        record = {
            "started": self.started,
            "first_step": self.first_step_at,
            "ended": time.time(),
            "training_s": self.training_s,
            "start_step": self.start_step,
            "end_step": trainer.global_step,
            "outcome": outcome,
            "checkpoint_stalls": checkpoint_stalls(trainer)[self.stalls_before :],
            "restart": restart_record(self.restart),
            "slow_ranks": slow_ranks(trainer),
        }
        self.start_step = None  # once an attempt: an exception after the end of training writes nothing more
        try:
            append_record(run_folder(trainer), record)
        except OSError as error:  # a full disk, a folder gone: the run's own outcome matters more than its record
            report(f"the goodput record could not be written in {run_folder(trainer)}: {first_line(error)}")


def checkpoint_stalls(trainer: Trainer) -> list[tuple[float, float]]:
    """Each save's (start, seconds blocked) so far, where the checkpoint IO measures them (the template's own)."""
    return list(getattr(trainer.strategy.checkpoint_io, "stalls", []))


def slow_ranks(trainer: Trainer) -> list[dict[str, Any]]:
    """The slow ranks named during this attempt: ``StepTimes.named`` (runtime/slow_rank.py) of the callback that holds
    the step times, the preemption check (runs/ does not import runtime/: found by its attribute)."""
    held = (getattr(callback, "step_times", None) for callback in trainer.callbacks)
    return [named for times in held for named in getattr(times, "named", [])]


def restart_record(restart: tuple[str, str] | None) -> dict[str, Any] | None:
    """RESTART (what, cause) with when its failure began and when it was known (warm restarts only: None where not
    measured)."""
    if restart is None:
        return None
    what, cause = restart
    failed_at, known_at = _env_time(restarts.FAILED_AT_VAR), _env_time(restarts.KNOWN_AT_VAR)
    return {"what": what, "cause": cause, "failed_at": failed_at, "known_at": known_at}


def _env_time(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def append_record(folder: Path, record: dict[str, Any]) -> None:
    """Appends RECORD to FOLDER's ``goodput.jsonl`` as one line in one write, flushed to disk. After a torn line (a
    process killed mid-write) the record starts a line of its own, so only the torn one is lost."""
    path = folder / GOODPUT_FILE
    line = json.dumps(record) + "\n"
    with open(path, "ab") as file:
        if file.tell() and not _ends_a_line(path):
            line = "\n" + line
        file.write(line.encode())
        file.flush()
        os.fsync(file.fileno())


def _ends_a_line(path: Path) -> bool:
    with open(path, "rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1) == b"\n"


def read_records(folder: Path) -> list[dict[str, Any]]:
    """The attempts' records in FOLDER, oldest first; a torn line is skipped. Raises ``FileNotFoundError``."""
    records = []
    for line in (folder / GOODPUT_FILE).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and {"started", "ended", "training_s"} <= record.keys():
            records.append(record)
    return records


@dataclass(frozen=True)
class Restart:
    cause: str
    detection_s: float | None  # from the failure to the moment rank 0's supervisor knew it
    recovery_s: float | None  # from then to the next attempt's first training step


@dataclass(frozen=True)
class Summary:
    attempts: int
    wall_s: float  # the first attempt's start to the last one's end
    training_s: float
    restarts: list[Restart]
    stall_count: int
    stall_s: float
    steps_redone: int  # of the attempts that follow one with a record
    slow_ranks: list[dict[str, Any]]  # each naming of a slow rank (runtime/slow_rank.py), oldest first

    @property
    def goodput(self) -> float:
        return self.training_s / self.wall_s if self.wall_s > 0 else 0.0


def summarize(records: list[dict[str, Any]]) -> Summary:
    """The run's figures from its attempts' RECORDS (``read_records``; at least one)."""
    stalls = [seconds for record in records for _, seconds in record.get("checkpoint_stalls", [])]
    return Summary(
        attempts=len(records),
        wall_s=max(record["ended"] for record in records) - min(record["started"] for record in records),
        training_s=math.fsum(record["training_s"] for record in records),
        restarts=[restart_of(record) for record in records if record.get("restart")],
        stall_count=len(stalls),
        stall_s=math.fsum(stalls),
        steps_redone=sum(steps_redone(before, after) for before, after in zip(records, records[1:], strict=False)),
        slow_ranks=[named for record in records for named in record.get("slow_ranks", [])],
    )


def restart_of(record: dict[str, Any]) -> Restart:
    """RECORD's restart: its detection and recovery where both ends are known (a clock behind another node's reads
    as 0, not less)."""
    restart = record["restart"]
    failed_at, known_at, first_step = restart.get("failed_at"), restart.get("known_at"), record.get("first_step")
    return Restart(
        cause=restart["cause"],
        detection_s=max(0.0, known_at - failed_at) if failed_at is not None and known_at is not None else None,
        recovery_s=max(0.0, first_step - known_at) if known_at is not None and first_step is not None else None,
    )


def steps_redone(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Steps trained twice: the step BEFORE's attempt reached, less the one AFTER resumed from (an older checkpoint)."""
    return max(0, before["end_step"] - after["start_step"])


def one_line(summary: Summary) -> str:
    """``goodput 87% (training 41.2 s of 47.3 s wall; 1 restart: rank 1 was killed by SIGKILL, detected 0.2 s,
    recovered 3.1 s; checkpoint stalls 0.4 s; 12 steps redone)``."""
    parts = [f"training {_duration(summary.training_s)} of {_duration(summary.wall_s)} wall"]
    if summary.restarts:
        count = len(summary.restarts)
        said = "; ".join(_restart_words(restart) for restart in summary.restarts[:2])
        more = f"; and {count - 2} more" if count > 2 else ""
        parts.append(f"{count} restart{'s' if count != 1 else ''}: {said}{more}")
    if summary.stall_count:
        parts.append(f"checkpoint stalls {_duration(summary.stall_s)}")
    if summary.steps_redone:
        parts.append(f"{summary.steps_redone} step{'s' if summary.steps_redone != 1 else ''} redone")
    if summary.slow_ranks:
        more = f", and {len(summary.slow_ranks) - 2} more" if len(summary.slow_ranks) > 2 else ""
        parts.append(f"slow: {', '.join(slow_words(named) for named in summary.slow_ranks[:2])}{more}")
    return f"goodput {summary.goodput:.0%} ({'; '.join(parts)})"


def slow_words(named: dict[str, Any]) -> str:
    """``rank 1 (host b) 2.0x the others from step 8``."""
    ratio = named["own_ms"] / named["others_ms"] if named["others_ms"] else math.inf
    return f"rank {named['rank']} (host {named['host']}) {ratio:.1f}x the others from step {named['step']}"


def _restart_words(restart: Restart) -> str:
    cause = restart.cause.partition(" (")[0]  # a hung rank's cause quotes its peer's error: the report has it
    cause = SOURCE_LOCATION.sub("", cause)  # gloo's "[/__w/pytorch/.../pair.cc:561] ": torch's build tree, not ours
    cause = cause if len(cause) <= CAUSE_CHARS else cause[: CAUSE_CHARS - 3] + "..."
    times = [
        f"{what} {_duration(seconds)}"
        for what, seconds in (("detected", restart.detection_s), ("recovered", restart.recovery_s))
        if seconds is not None
    ]
    return ", ".join([cause, *times])


def _duration(seconds: float) -> str:
    """``41.2 s``, or ``3.4 ms`` below a tenth of a second (a killed rank's detection, a toy run's stalls)."""
    return f"{seconds:.1f} s" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


def say_goodput(trainer: Trainer) -> None:
    """Rank 0's line at the end of a fit: the run's goodput over all its attempts so far."""
    if not trainer.is_global_zero:
        return
    try:
        records = read_records(run_folder(trainer))
    except OSError:
        return
    if records:
        report(one_line(summarize(records)))
