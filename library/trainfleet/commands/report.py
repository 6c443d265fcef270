"""``python -m PACKAGE report RUN_FOLDER [--out PATH]``: what a run lost, from its goodput record (runs/goodput.py):
a table on the screen and a timeline PNG, one bar per attempt (``RUN_FOLDER/goodput.png`` by default)."""

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from trainfleet import program
from trainfleet.exit_codes import REFUSED_EXIT_CODE
from trainfleet.runs.goodput import GOODPUT_FILE, Summary, read_records, restart_of, slow_words, summarize

# "training": from the first step on, its data waits and validation included (the table has the steps' own time).
COLOURS = {"start-up": "#b0b0b0", "training": "#4c9a2a", "checkpoint stall": "#e8a33d", "restart gap": "#c0392b"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {program.package} report", description=__doc__.split(": ", 1)[1])
    parser.add_argument("run_folder", type=Path, help="a fit's run folder, e.g. runs/digits/lightning_logs/version_0")
    parser.add_argument("--out", type=Path, help="the timeline PNG to write (default: RUN_FOLDER/goodput.png)")
    args = parser.parse_args(argv)
    problem = input_problem(args.run_folder)
    if problem is None and importlib.util.find_spec("matplotlib") is None:
        problem = "the report's timeline needs matplotlib: pip install -e '.[plot]'"
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return REFUSED_EXIT_CODE
    records = read_records(args.run_folder)
    print(table(args.run_folder, records))
    out = args.out or args.run_folder / "goodput.png"
    plot_timeline(records, out, title=str(args.run_folder))
    print(f"timeline: {out}")
    return 0


def input_problem(folder: Path) -> str | None:
    """Why FOLDER has no record to report, in one line; None when it has one."""
    if not folder.is_dir():
        return f"no run folder {folder}"
    if not (folder / GOODPUT_FILE).is_file():
        return f"{folder} has no goodput record ({GOODPUT_FILE}): a fit writes one in its run folder (version_N)"
    if not read_records(folder):
        return f"{folder / GOODPUT_FILE} holds no complete record"
    return None


ATTEMPT_HEADER = (
    "attempt  outcome                 start s  first step s    end s  training s  steps      stalls  stall s"
)
RESTART_HEADER = "restart  detection s  recovery s  cause"


def table(folder: Path, records: list[dict[str, Any]]) -> str:
    """The run's figures, then one row per attempt and one per restart."""
    summary = summarize(records)
    attempts = f"{len(records)} attempt{'s' if len(records) != 1 else ''}"
    lines = [f"goodput record of {folder} ({attempts})", *totals(summary), "", ATTEMPT_HEADER, *attempt_rows(records)]
    if summary.restarts:
        lines += ["", RESTART_HEADER, *restart_rows(records)]
    if summary.slow_ranks:
        lines += ["", "slow ranks (own work a step: the wait for its batch and its forward)", *slow_rows(records)]
    return "\n".join(lines)


def attempt_rows(records: list[dict[str, Any]]) -> list[str]:
    """One line per attempt, its times in seconds from the run's first start."""
    origin, rows = min(record["started"] for record in records), []
    for number, record in enumerate(records):
        stalls = [seconds for _, seconds in record.get("checkpoint_stalls", [])]
        first = _seconds(record["first_step"] - origin if record.get("first_step") else None)
        steps = f"{record['start_step']}-{record['end_step']}"
        rows.append(
            f"{number:<7}  {record['outcome'][:22]:<22}  {record['started'] - origin:7.2f}  {first:>12}"
            f"  {record['ended'] - origin:7.2f}  {record['training_s']:10.2f}  {steps:<9}  {len(stalls):6}"
            f"  {sum(stalls):7.2f}"
        )
    return rows


def restart_rows(records: list[dict[str, Any]]) -> list[str]:
    """One line per restart: its detection and recovery seconds (- where not measured), and its cause."""
    rows = []
    for number, record in enumerate((record for record in records if record.get("restart")), start=1):
        restart, what = restart_of(record), record["restart"].get("what")
        cause = f"{what}: {restart.cause}" if what else restart.cause
        rows.append(f"{number:<7}  {_seconds(restart.detection_s):>11}  {_seconds(restart.recovery_s):>10}  {cause}")
    return rows


def slow_rows(records: list[dict[str, Any]]) -> list[str]:
    """One line per slow rank named: its figures, and the seconds from its attempt's first step to the naming."""
    rows = []
    for record in records:
        for named in record.get("slow_ranks", []):
            after = named["at"] - record["first_step"] if record.get("first_step") else None
            rows.append(
                f"{slow_words(named)}: {named['own_ms']:.1f} ms against {named['others_ms']:.1f} ms, named"
                f" {_seconds(after)} s after its attempt's first step"
            )
    return rows


def totals(summary: Summary) -> list[str]:
    return [
        f"wall time          {summary.wall_s:.2f} s",
        f"training           {summary.training_s:.2f} s",
        f"goodput            {summary.goodput:.1%}",
        f"restarts           {len(summary.restarts)}",
        f"checkpoint stalls  {summary.stall_count}, {summary.stall_s:.2f} s",
        f"steps redone       {summary.steps_redone}",
    ]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot_timeline(records: list[dict[str, Any]], out: Path, title: str) -> None:
    """One bar per attempt on one axis of seconds from the run's first start: start-up (or the restart's gap), then
    training, with the checkpoint stalls over it, and the gap from a failure to the attempt's end."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    origin = min(record["started"] for record in records)
    figure, axis = plt.subplots(figsize=(10, 1.2 + 0.6 * len(records)), constrained_layout=True)
    for row, (record, following) in enumerate(zip(records, [*records[1:], None], strict=True)):
        for kind, start, end in segments(record, following):
            axis.broken_barh([(start - origin, end - start)], (row - 0.35, 0.7), color=COLOURS[kind])
    axis.set_yticks(range(len(records)), [f"attempt {number}" for number in range(len(records))])
    axis.invert_yaxis()  # the first attempt on top
    axis.set(xlabel="seconds since the run's first start", title=f"goodput timeline: {title}")
    axis.grid(axis="x", alpha=0.3)
    handles = [Patch(color=colour, label=kind) for kind, colour in COLOURS.items()]
    axis.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the bars, never over them
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100, metadata={"Software": None})  # no version string: the same record, the same file
    plt.close(figure)


def segments(record: dict[str, Any], following: dict[str, Any] | None) -> list[tuple[str, float, float]]:
    """RECORD's (kind, start, end) spans, in ``time.time()`` seconds: a restart's gap is drawn from the failure (which
    the FOLLOWING attempt's record dates) to the end of RECORD's attempt, and on from the start of the next to its
    first step."""
    first_step = record.get("first_step") or record["ended"]
    spans = [("restart gap" if record.get("restart") else "start-up", record["started"], first_step)]
    failed_at = ((following or {}).get("restart") or {}).get("failed_at")
    stop = record["ended"] if failed_at is None else min(max(failed_at, first_step), record["ended"])
    spans.append(("training", first_step, stop))
    if stop < record["ended"]:
        spans.append(("restart gap", stop, record["ended"]))
    spans += [("checkpoint stall", at, at + seconds) for at, seconds in record.get("checkpoint_stalls", [])]
    return spans
