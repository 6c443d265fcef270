"""benchmarks/overhead.py runs its three sides for real, training the same model: a smoke run, never a timing test."""

import json
import subprocess
import sys

import pytest
from helpers import LIBRARY, REPO, project_env

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds

CONFIG = "cpu-in-memory-1p"  # one rank: three fresh interpreters, not five (tests/test_gradient_sync.py: 2 ranks)


def test_quick_benchmark_trains_the_same_model_on_every_side(tmp_path, monkeypatch, capsys):
    output = tmp_path / "benchmark.json"
    monkeypatch.syspath_prepend(str(LIBRARY))
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--quick", "--only", CONFIG, "--output", str(output)])
    # In this process, which has imported torch and Lightning already; each side is a fresh one.
    from benchmarks import overhead

    assert overhead.main() == 0
    configs = json.loads(output.read_text())["configs"]
    assert list(configs) == [CONFIG]
    bench = configs[CONFIG]
    for side in ("plain", "bare", "template"):
        assert bench[side]["steps_per_s"] > 0 and bench[side]["samples_per_s"] > 0
        assert bench[side]["time_to_first_step_s"] > 0 and bench[side]["peak_rss_mb"] > 0
    # Bit-identical initial weights, and the same loss after the same steps on the same shards.
    assert bench["same_init"]
    for side in ("bare", "template"):
        assert bench["plain"]["loss"] == pytest.approx(bench[side]["loss"], rel=1e-4)
    assert bench["match"]
    printed = capsys.readouterr().out
    assert CONFIG in printed and "ok" in printed


def test_data_benchmark_loads_the_same_images_through_both_data_paths():
    """benchmarks/data.py: the template's loader and the hand-written one, one row, a few batches a side."""
    command = [sys.executable, "-m", "benchmarks.data", "--only", "image-folder-1p-0w", "--batches", "3"]
    command += ["--repeats", "1"]
    result = subprocess.run(command, cwd=LIBRARY, env=project_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("image-folder-1p-0w"))
    plain, template, ratio = map(float, row.split()[1:])
    assert plain > 0 and template > 0 and ratio == pytest.approx(template / plain, abs=0.01)


@pytest.mark.parametrize(
    ("module", "flags", "said"),
    [
        ("ledger", ["--nprocs", "1", "--steps", "150", "--rounds", "1", "--sides-only"], "| template / bare"),
        ("step_cost", ["--steps", "150", "--repeats", "1"], "the template's own work:"),
    ],
)
def test_the_benchmarks_that_build_the_template_in_their_own_process_run_it(module, flags, said):
    """benchmarks/ledger.py and step_cost.py build the project's CLI in-process (the others start `python -m project`):
    the template's project is named for them (benchmarks/__init__.py), as for the tests (conftest.py)."""
    command = [sys.executable, "-m", f"benchmarks.{module}", *flags]
    result = subprocess.run(command, cwd=LIBRARY, env=project_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert said in result.stdout
