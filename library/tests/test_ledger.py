"""benchmarks/ledger.py's arithmetic, without running it: a part's figure is the median of its fits' differences from
the template's fit of the same round, signed as what the part costs, and the template's speed against another side
the median of the rounds' ratios; the table goes between the markers. And one part's switch, on a real fit."""

import sys
from pathlib import Path

import pytest
from helpers import quick_args

from trainfleet import lightning_internals as internals
from trainfleet.cli import build_cli
from trainfleet.runtime.preemption import PreemptionCheck

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
from benchmarks import ledger  # noqa: E402


def test_a_part_costs_the_median_of_its_differences_from_the_same_rounds_template():
    template = [1.0e-3, 2.0e-3, 1.1e-3]  # the second round was slow for every fit: paired, it cancels
    times = {"bare": [0.9e-3, 1.9e-3, 0.8e-3], "peer": [3e-3, 3e-3, 3e-3], "template": template}
    for part in ledger.PARTS:  # switched off it saves 20 µs; switched on it costs 30 µs
        times[part.name] = [seconds - 20e-6 if part.off else seconds + 30e-6 for seconds in template]
    found = ledger.summary(times)
    assert found["template"] == pytest.approx(1100) and found["bare"] == pytest.approx(900)
    assert found["template / bare"] == pytest.approx(0.9)  # the rounds' 0.9, 0.95 and 0.727, not 900 / 1100
    for part in ledger.PARTS:
        assert found[part.name] == pytest.approx(20 if part.off else 30), part.name
    table = ledger.table({1: found}, "python -m benchmarks.ledger")
    assert "| template / bare, steps/s | 0.90 |" in table


def test_sides_only_gives_the_three_sides_and_their_ratios_and_no_part():
    times = {"bare": [1e-3], "peer": [3e-3], "template": [1.25e-3]}
    table = ledger.table({1: ledger.summary(times)}, "python -m benchmarks.ledger")
    assert "| template / bare, steps/s | 0.80 |" in table and "| template / peer pattern, steps/s | 2.40 |" in table
    assert not any(part.name in table for part in ledger.PARTS)


def test_the_table_replaces_what_stands_between_the_markers(tmp_path):
    doc = tmp_path / "performance.md"
    start, end = ledger.MARKERS
    doc.write_text(f"before\n{start}\nold table\n{end}\nafter\n")
    ledger.write_into(doc, "new table")
    assert doc.read_text() == f"before\n{start}\nnew table\n{end}\nafter\n"


def test_the_slow_rank_clock_switched_off_leaves_its_hooks_idle_and_the_check_counting_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    cli = build_cli(quick_args(tmp_path), run=False)
    [check] = [callback for callback in cli.trainer.callbacks if isinstance(callback, PreemptionCheck)]
    hooks = ("on_train_epoch_start", "on_train_batch_start", "on_before_backward")
    assert all(internals._overrides(check, hook) for hook in hooks)
    ledger.no_step_times(cli)
    assert not any(internals._overrides(check, hook) for hook in hooks)  # skipped, as hooks no callback overrides
    check.on_train_batch_end(cli.trainer, cli.model, None, None, 0)
    assert check._steps == 1  # the check itself still runs at each step's end
