"""FSDP2 against DDP on the same model and processes: memory per rank, and the training stall per checkpoint.

    python -m benchmarks.sharding --repeats 3          # JSON to runs/benchmark_sharding/results.json
    python -m benchmarks.sharding --stall ddp --no-memory    # the single-file stall alone

- memory: after a few steps, each rank's bytes of parameters, gradients and optimizer state (its own shards under
  FSDP2) and its peak RSS, for DDP and FSDP2 on 2 processes; the ratio of model-state bytes FSDP2 / DDP.
- checkpoint stall: FSDP2 on 2 processes saving ``last.ckpt`` every few steps, synchronously and in the background
  (``async_save``), alternating; the time each save holds training (``trainer.save_checkpoint``'s time, which includes
  waiting for the previous background save), median over the saves of every repeat, against the synchronous save.
  The same for DDP's single file (``--stall ddp``): ``AtomicCheckpointIO`` against ``AsyncAtomicCheckpointIO``
  (``checkpoints/files.py``: a copy of the tensors at the step, the write in a thread).

The model is the digits MLP made wide (hidden sizes 4096, 4096: 17M parameters, a 134 MB checkpoint with SGD's
momentum), real fits of ``python -m project fit`` with a probe callback (this module, by class path).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

REPO = Path(__file__).resolve().parents[2]  # the template: its configs and its project
LIBRARY = REPO / "library"
WIDE = ["--model.network.init_args.hidden_sizes", "[4096, 4096]", "--trainer.enable_progress_bar", "false"]
FSDP = ["--config", str(REPO / "configs" / "fsdp.yaml")]
WRITER = "--trainer.plugins=trainfleet.checkpoints.files."
STALL_FLAGS = {  # (synchronous, asynchronous) flags of each kind of checkpoint
    "fsdp2": tuple([*FSDP, "--trainer.strategy.init_args.async_save", side] for side in ("false", "true")),
    "ddp": tuple([WRITER + name] for name in ("AtomicCheckpointIO", "AsyncAtomicCheckpointIO")),
}


def local_bytes(tensor: torch.Tensor) -> int:
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


class MemoryProbe(Callback):
    """Before the optimizer step of step ``at_step``: this rank's bytes of parameters, gradients, optimizer state."""

    def __init__(self, output_dir: str, at_step: int = 3) -> None:
        self.output_dir, self.at_step = output_dir, at_step

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if trainer.global_step != self.at_step:
            return
        parameters = list(pl_module.network.parameters())
        states = [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
        record = {
            "parameters": sum(local_bytes(p) for p in parameters),
            "gradients": sum(local_bytes(p.grad) for p in parameters if p.grad is not None),
            "optimizer_state": sum(local_bytes(value) for value in states),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        Path(self.output_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


class SaveTimer(Callback):
    """Times every ``trainer.save_checkpoint`` on rank 0 (collecting the state, the strategy's save, the barrier after):
    how long each save holds training."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.seconds: list[float] = []

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        save = trainer.save_checkpoint

        def timed(*args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            save(*args, **kwargs)
            self.seconds.append(time.perf_counter() - start)

        trainer.save_checkpoint = timed

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            Path(self.output_dir, "saves.json").write_text(json.dumps(self.seconds))


def fit(workdir: Path, *flags: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(LIBRARY), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "project", "fit", "--config", str(REPO / "configs" / "digits.yaml"), *WIDE]
    command += ["--trainer.default_root_dir", str(workdir), "--trainer.devices", "2", *flags]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fit failed ({done.returncode}):\n{done.stderr[-3000:]}")


def memory(workdir: Path) -> dict[str, Any]:
    rows = {}
    for side, flags in (("ddp", []), ("fsdp2", FSDP)):
        out = workdir / f"memory-{side}"
        out.mkdir(parents=True)
        probe = ["--trainer.callbacks+=benchmarks.sharding.MemoryProbe", "--trainer.callbacks.output_dir", str(out)]
        fit(out, *flags, *probe, "--trainer.max_steps", "4", "--checkpoint.save_last", "false")
        rows[side] = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    state = {
        side: max(r["parameters"] + r["gradients"] + r["optimizer_state"] for r in ranks)
        for side, ranks in rows.items()
    }
    return {"per_rank": rows, "model_state_bytes": state, "ratio_fsdp2_to_ddp": state["fsdp2"] / state["ddp"]}


def stall(workdir: Path, kind: str, repeats: int, steps: int, every: int) -> dict[str, Any]:
    saves: dict[str, list[float]] = {"sync": [], "async": []}
    for repeat in range(repeats):
        for side, side_flags in zip(("sync", "async"), STALL_FLAGS[kind], strict=True):  # alternating
            out = workdir / f"stall-{kind}-{side}-{repeat}"
            out.mkdir(parents=True)
            timer = ["--trainer.callbacks+=benchmarks.sharding.SaveTimer", "--trainer.callbacks.output_dir", str(out)]
            checkpoints = ["--checkpoint.every_n_train_steps", str(every), "--checkpoint.save_top_k", "0"]
            fit(
                out,
                *side_flags,
                *checkpoints,
                *timer,
                "--trainer.max_steps",
                str(steps),
                "--trainer.limit_val_batches",
                "0",
            )
            saves[side] += json.loads((out / "saves.json").read_text())
    checkpoint = next(workdir.glob(f"stall-{kind}-sync-0/**/last.ckpt"))
    files = checkpoint.rglob("*") if checkpoint.is_dir() else [checkpoint]
    size = sum(path.stat().st_size for path in files if path.is_file())
    medians = {side: statistics.median(seconds) for side, seconds in saves.items()}
    return {
        "checkpoint_bytes": size,
        "saves": saves,
        "median_s": medians,
        "ratio_async_to_sync": medians["async"] / medians["sync"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each side of the stall row")
    parser.add_argument("--steps", type=int, default=40, help="training steps per stall run")
    parser.add_argument("--every", type=int, default=8, help="steps between checkpoints")
    parser.add_argument("--stall", nargs="*", choices=sorted(STALL_FLAGS), default=["fsdp2", "ddp"], help="stall rows")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory row")
    parser.add_argument("--output", type=Path, default=REPO / "runs" / "benchmark_sharding" / "results.json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="benchmark-sharding-") as scratch:
        if not args.no_memory:
            results["memory"] = memory(Path(scratch))
        for kind in args.stall:
            results[f"checkpoint_stall_{kind}"] = stall(Path(scratch), kind, args.repeats, args.steps, args.every)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    if "memory" in results:
        mem = results["memory"]
        print(
            "memory per rank, parameters + gradients + optimizer state:"
            f" DDP {mem['model_state_bytes']['ddp'] / 2**20:.1f} MiB,"
            f" FSDP2 {mem['model_state_bytes']['fsdp2'] / 2**20:.1f} MiB: ratio {mem['ratio_fsdp2_to_ddp']:.3f}"
        )
    for kind in args.stall:
        ckpt = results[f"checkpoint_stall_{kind}"]
        print(
            f"{kind}, checkpoint of {ckpt['checkpoint_bytes'] / 1e6:.0f} MB: training stall per save, median:"
            f" synchronous {ckpt['median_s']['sync'] * 1e3:.0f} ms, asynchronous {ckpt['median_s']['async'] * 1e3:.0f}"
            f" ms: ratio {ckpt['ratio_async_to_sync']:.3f}"
        )
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
