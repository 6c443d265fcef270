"""scripts/benchmark.py runs its three sides for real, training the same model: a smoke run, never a timing test."""

import json
import subprocess
import sys

from conftest import REPO, project_env

CONFIG = "cpu-in-memory-2p"  # two ranks: DDP gradient averaging on both sides, the template's own launcher


def test_quick_benchmark_trains_the_same_model_on_every_side(tmp_path):
    output = tmp_path / "benchmark.json"
    command = [sys.executable, "scripts/benchmark.py", "--quick", "--only", CONFIG, "--output", str(output)]
    result = subprocess.run(command, cwd=REPO, env=project_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    configs = json.loads(output.read_text())["configs"]
    assert list(configs) == [CONFIG]
    bench = configs[CONFIG]
    for side in ("plain", "bare", "template"):
        assert bench[side]["steps_per_s"] > 0 and bench[side]["samples_per_s"] > 0
        assert bench[side]["time_to_first_step_s"] > 0 and bench[side]["peak_rss_mb"] > 0
    # Bit-identical initial weights, and the same loss after the same steps on the same shards.
    assert bench["same_init"]
    for side in ("bare", "template"):
        assert abs(bench["plain"]["loss"] - bench[side]["loss"]) <= 1e-4 * bench["plain"]["loss"]
    assert bench["match"]
    assert CONFIG in result.stdout and "ok" in result.stdout
