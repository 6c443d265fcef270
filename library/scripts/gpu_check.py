"""The GPU proof: every GPU path of the template, run for real on one GPU, in a few minutes.

    python scripts/gpu_check.py                  # after scripts/gpu_check.sh has installed the project offline

Writes ``runs/gpu_check/gpu_check.json`` (one entry per check: passed, seconds, figures) and ``gpu_check.log`` (every
command's output). Checks: the doctor; a 1-GPU fit with configs/gpu.yaml (NCCL, bf16) to test accuracy >= 0.90, and
a ``test`` of its checkpoint; the same fit with ``torch.cuda.set_sync_debug_mode("error")`` on for the steady steps
between logging steps (any host sync there fails the run); configs/fsdp.yaml (FSDP2) on 1 GPU, with and without
bf16 parameters (its mixed-precision policy); torch.compile; no CUDA call before a warm-restart supervisor forks; the
suite's GPU tests (in-memory data on the device); the benchmark's CUDA rows. Each fit reports its last logged MFU.
Exit code 0 only when every check passed.
"""

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

REPO = Path(__file__).resolve().parents[2]  # the template: its configs and its project
OUT = REPO / "runs" / "gpu_check"
BASE = ["--config", "configs/digits.yaml", "--config", "configs/gpu.yaml", "--trainer.devices", "1"]
QUIET = ["--trainer.enable_progress_bar", "false"]


class SyncDebug(Callback):
    """Turns CUDA sync debugging to "error" for every training step that is not a logging step (nor the first)."""

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        steady = trainer.global_step > 0 and (trainer.global_step + 1) % trainer.log_every_n_steps != 0
        torch.cuda.set_sync_debug_mode("error" if steady else 0)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        torch.cuda.set_sync_debug_mode(0)


def run(log, *command: str, timeout: float = 240) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'scripts'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    log.write(f"\n$ {' '.join(command)}\n")
    try:
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        output, code = result.stdout + result.stderr, result.returncode
    except subprocess.TimeoutExpired as error:
        output, code = f"{error.stdout or ''}{error.stderr or ''}\ntimed out after {timeout} s", 124
    log.write(output)
    log.flush()
    return code, output


def project(log, *args: str, timeout: float = 240) -> tuple[int, str]:
    return run(log, sys.executable, "-m", "project", *args, timeout=timeout)


# What a warm-restart supervisor runs before it forks its rank (trainfleet/main.py, runtime/warm_restart.py), in
# a fresh interpreter whose CUDA entry points count their calls: a forked rank cannot use a CUDA context made before.
CUDA_BEFORE_FORK = """
import json, torch
calls = []
for name in ("_cuda_init", "_cuda_getDeviceCount"):
    real = getattr(torch._C, name, None)
    if real is not None:
        setattr(torch._C, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
import trainfleet.main, trainfleet.cli, trainfleet.runtime.warm_restart as warm_restart
from trainfleet.commands.doctor import apply_debug_switch
from trainfleet.runtime.known_noise import silence_known_noise
apply_debug_switch()
silence_known_noise()
print(json.dumps({"calls": calls, "initialized": torch.cuda.is_initialized()}))
"""


def cuda_before_fork(log) -> dict[str, Any]:
    code, output = run(log, sys.executable, "-c", CUDA_BEFORE_FORK)
    found = json.loads(output.strip().splitlines()[-1]) if code == 0 else None
    return {"passed": found == {"calls": [], "initialized": False}, "found": found}


def test_acc(root: Path) -> float | None:
    found = sorted(root.glob("lightning_logs/version_*/test_metrics.json"))
    return json.loads(found[-1].read_text())["test_acc"] if found else None


def fit_and_test(log, name: str, *extra: str, epochs: int = 20) -> dict[str, Any]:
    root = OUT / name
    args = [*BASE, *QUIET, "--trainer.default_root_dir", str(root), "--trainer.max_epochs", str(epochs), *extra]
    fit_code, _ = project(log, "fit", *args)
    test_code, _ = project(log, "test", *args, "--ckpt_path", "last") if fit_code == 0 else (None, "")
    accuracy = test_acc(root)
    passed = fit_code == 0 and test_code == 0 and (accuracy or 0) >= 0.90
    return {"passed": passed, "test_acc": accuracy, "last_mfu": last_logged(root, "mfu")}


def last_logged(root: Path, column: str) -> float | None:
    """The last value the fit logged in COLUMN of its metrics.csv (MFU: the GPU's peak is known to Lightning)."""
    found = sorted(root.glob("lightning_logs/version_0/metrics.csv"))
    rows = list(csv.DictReader(found[0].open())) if found else []
    values = [row[column] for row in rows if row.get(column)]
    return float(values[-1]) if values else None


def checks(log) -> dict[str, Any]:
    doctor_code, doctor = project(log, "doctor")
    sync_code, sync_output = project(
        log, "fit", *BASE, *QUIET, "--trainer.default_root_dir", str(OUT / "sync_debug"),
        "--trainer.max_epochs", "2", "--trainer.callbacks+=gpu_check.SyncDebug",
    )  # fmt: skip
    bench = OUT / "benchmark.json"
    rows = ["cuda-in-memory-1p-cnn", "cuda-dataloader-1p", "cuda-in-memory-1p"]
    benchmark = [sys.executable, "-m", "benchmarks.overhead", "--only", *rows, "--output", str(bench)]
    bench_code, _ = run(log, *benchmark, timeout=400)
    # The suite's GPU tests (in-memory splits on the device), which skip without CUDA.
    pytest = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "tests/test_throughput.py"]  # no xdist needed
    gpu_tests_code, gpu_tests = run(log, *pytest)
    return {
        "gpu_tests": {"passed": gpu_tests_code == 0 and " skipped" not in gpu_tests, "report": gpu_tests[-500:]},
        "doctor": {"passed": doctor_code == 0, "report": doctor[-2000:]},
        "no_cuda_before_the_supervisors_fork": cuda_before_fork(log),
        "fit_gpu_yaml_bf16": fit_and_test(log, "fit"),
        "no_host_sync_in_steady_steps": {"passed": sync_code == 0, "error": sync_output[-500:] if sync_code else None},
        "fsdp_one_gpu": fit_and_test(log, "fsdp", "--config", "configs/fsdp.yaml", "--trainer.devices", "1"),
        "fsdp_bf16_params": fit_and_test(
            log, "fsdp_bf16", "--config", "configs/fsdp.yaml", "--trainer.strategy.init_args.param_dtype", "bfloat16"
        ),
        "compile": fit_and_test(log, "compile", "--model.compile", "true"),
        "benchmark_cuda": {
            "passed": bench_code == 0,
            "results": json.loads(bench.read_text()) if bench.is_file() else None,
        },
    }


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(OUT / "gpu_check.log", "w") as log:
        results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, **checks(log)}
    results["seconds"] = round(time.monotonic() - start, 1)
    (OUT / "gpu_check.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0 if all(check["passed"] for check in results.values() if isinstance(check, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
