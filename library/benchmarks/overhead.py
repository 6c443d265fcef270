"""Races the template (the real ``python -m project fit``) against the hand-written DDP script it replaces and
against the bare Lightning Trainer, so that what Lightning costs and what the template adds are told apart.

    python -m benchmarks.overhead                        # CPU/gloo on 1 and 2 processes, plus GPU/NCCL when present
    python -m benchmarks.overhead --quick --only cpu-dataloader-1p cpu-in-memory-2p   # a smoke run (tests)
    python -m benchmarks.overhead --threads 1   # shared machine: 2-thread runs stall whenever another process runs

Each configuration (device, pipeline "dataloader" or "in-memory", processes, network) runs the three sides
alternately ``--repeats`` times with the same network, data, per-rank batch, steps, seed and OMP_NUM_THREADS:
``plain`` (benchmarks/plain_ddp.py), ``bare`` (benchmarks/bare_lightning.py: a Trainer and a LightningModule with only
training_step and configure_optimizers) and ``template``. It reports medians: steps/s and samples/s from the first
step's start to the last step's end (timed in-process), wall time from launch to exit, time to first step, peak
memory, and the template's ratios to both. Every side must start from identical weights and end at the same loss
(exit 1 otherwise). Also reported: the template's defaults (in-memory) against the classic DataLoader script, and
2-vs-1-process scaling of a wider, compute-bound MLP. Rows: the digits MLP, the wide MLP, and ``-cnn``, the
SmallCNN on synthetic 3x32x32 images (batch 128), a compute-realistic step.
Bare Lightning and the template are timed by ``StepTimer``, which the template's CLI loads from this module by class
path (``benchmarks.overhead.StepTimer``; library/ on PYTHONPATH).
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from benchmarks.plain_ddp import FILE_PIPELINES, LAST_STEPS, LAUNCH_TIME, rank_stats, weights_digest, write_rank_stats

REPO = Path(__file__).resolve().parents[2]  # the template: its configs and its project
LIBRARY = REPO / "library"  # where `benchmarks` is: on the children's PYTHONPATH
SIDES = ("plain", "bare", "template")
PIPELINES = ("dataloader", "in-memory")
DEFAULT_NET, WIDE_NET = (128, 64), (1024, 1024)
SEED = 42  # initial weights (seed_everything) and training order (DistributedSampler) on both sides
LOSS_RTOL = 1e-4
RUN_TIMEOUT_S = 300
# A leftover rank variable would make the template think an external launcher (torchrun, SLURM) started it.
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "WORLD_SIZE", "PL_GLOBAL_SEED")


class StepTimer(Callback):
    """Times the template's steps the way plain_ddp.py times its own and writes the same JSON per rank."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.losses: deque = deque(maxlen=LAST_STEPS)
        self.samples = 0
        self.start = self.end = self.first_step_unix = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.init_digest = weights_digest(pl_module.network)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.start is None:
            self.start, self.first_step_unix = time.perf_counter(), time.time()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.losses.append(outputs["loss"].detach())
        self.samples += len(batch[1])
        if trainer.global_step >= trainer.max_steps:
            if pl_module.device.type == "cuda":
                torch.cuda.synchronize()
            self.end = time.perf_counter()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        stats = rank_stats(self.start, self.end, self.first_step_unix, trainer.global_step, self.samples, self.losses)
        write_rank_stats({**stats, "init_digest": self.init_digest}, self.output_dir)


@dataclass(frozen=True)
class Config:
    device: str  # "cpu" (gloo) or "cuda" (NCCL)
    pipeline: str
    nprocs: int
    batch_size: int
    steps: int
    hidden_sizes: tuple[int, ...] = DEFAULT_NET
    network: str = "mlp"  # or "cnn": SmallCNN on synthetic 3x32x32 images
    num_workers: int = 0  # loader workers per rank, file pipelines

    @property
    def name(self) -> str:
        workers = f"-{self.num_workers}w" if self.pipeline in FILE_PIPELINES else ""
        suffix = "-cnn" if self.network == "cnn" else "-wide" if self.hidden_sizes == WIDE_NET else ""
        return f"{self.device}-{self.pipeline}-{self.nprocs}p{workers}{suffix}"


def all_configs(args: argparse.Namespace) -> list[Config]:
    counts = {"cpu": (1, 2)}
    if torch.cuda.is_available():
        counts["cuda"] = tuple(sorted({1, min(2, torch.cuda.device_count())}))
    configs = []
    for device, nprocs in counts.items():
        configs += [Config(device, p, n, args.batch_size, args.steps) for p in PIPELINES for n in nprocs]
        configs += [Config(device, "in-memory", n, args.wide_batch_size, args.wide_steps, WIDE_NET) for n in nprocs]
        configs += [Config(device, "in-memory", n, args.cnn_batch_size, args.cnn_steps, network="cnn") for n in nprocs]
    configs += file_configs(args)
    return configs


def file_configs(args: argparse.Namespace) -> list[Config]:
    """The data paths over files (the digits as PNGs, and as LitData shards): 1 and 2 processes, 0 and 2 workers."""
    return [
        Config("cpu", pipeline, n, args.batch_size, args.steps, num_workers=workers)
        for pipeline in FILE_PIPELINES
        for n in (1, 2)
        for workers in (0, 2)
    ]


def digit_files() -> Path:
    """The digits as an image folder and as shards, written once into the system's temp folder."""
    if str(REPO) not in sys.path:  # the template's data tools are scripts of the project, beside the library
        sys.path.append(str(REPO))
    from scripts.make_shards import write_shards
    from scripts.write_digit_images import write_digit_images

    from trainfleet.data import ImageFolderDataModule

    root = Path(tempfile.gettempdir()) / "project-benchmark-digit-files"
    if not (root / "shards" / "dataset.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        write_digit_images(root / "images")
        write_shards(ImageFolderDataModule(str(root / "images"), grayscale=True), str(root / "shards"), "64MB", 1, 0)
    return root


def file_flags(config: Config) -> dict[str, str]:
    """The template's data module for a file pipeline (nothing for the others)."""
    if config.pipeline not in FILE_PIPELINES:
        return {}
    if config.pipeline == "image-folder":
        data = {"data": "trainfleet.data.ImageFolderDataModule", "data.init_args.grayscale": "true"}
        data["data.init_args.root"] = str(digit_files() / "images")
    else:
        data = {"data": "trainfleet.data.StreamingDataModule", "data.init_args.root": str(digit_files() / "shards")}
    return {**data, "data.init_args.num_workers": str(config.num_workers)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(nprocs: int, threads: int | None) -> dict[str, str]:
    """The same for both sides: OMP threads (default: cores over ranks), a fresh port, benchmarks/ importable."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    paths = [str(LIBRARY), *filter(None, [env.get("PYTHONPATH")])]
    threads = threads or max(1, (os.cpu_count() or 1) // nprocs)
    env.update(PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return env


def launches(side: str, config: Config, workdir: Path) -> list[tuple[list[str], dict[str, str]]]:
    """(command, extra environment) per process we start: every rank for plain, rank 0 for Lightning's launcher."""
    output = workdir / side
    if side in ("plain", "bare"):
        args = ["--output-dir", str(output), "--steps", str(config.steps), "--batch-size", str(config.batch_size)]
        args += ["--seed", str(SEED), "--pipeline", config.pipeline, "--device", config.device]
        args += ["--network", config.network, "--hidden-sizes", *map(str, config.hidden_sizes)]
        if config.pipeline in FILE_PIPELINES:
            root = digit_files() / ("images" if config.pipeline == "image-folder" else "shards")
            args += ["--data-root", str(root), "--num-workers", str(config.num_workers)]
        if side == "bare":
            bare = [sys.executable, "-m", "benchmarks.bare_lightning", "--nprocs", str(config.nprocs)]
            return [([*bare, *args], {})]
        command = [sys.executable, "-m", "benchmarks.plain_ddp", *args]
        world = {"WORLD_SIZE": str(config.nprocs)}
        return [(command, {**world, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in range(config.nprocs)]
    network = {"model.network.init_args.hidden_sizes": json.dumps(list(config.hidden_sizes))}
    if config.network == "cnn":
        images = "benchmarks.plain_ddp.SyntheticImages"
        network = {"model.network": "project.networks.SmallCNN", "data.class_path": images}
    flags = {
        "config": "configs/digits.yaml",
        **network,
        **file_flags(config),
        "seed_everything": str(SEED),
        "data.init_args.seed": str(SEED),
        "data.init_args.batch_size": str(config.batch_size),
        "data.init_args.in_memory": str(config.pipeline == "in-memory").lower(),
        "model.scheduler": "null",
        "trainer.accelerator": "gpu" if config.device == "cuda" else "cpu",
        "trainer.devices": str(config.nprocs),
        "trainer.max_steps": str(config.steps),
        "trainer.max_epochs": "-1",
        "trainer.limit_val_batches": "0",  # no validation, no sanity check
        "trainer.logger": "false",
        "trainer.enable_progress_bar": "false",
        "trainer.enable_model_summary": "false",
        # The CLI always adds a ModelCheckpoint (so enable_checkpointing false is refused): make it save nothing.
        "checkpoint.save_top_k": "0",
        "checkpoint.save_last": "false",
        "trainer.default_root_dir": str(workdir / "run"),
        "trainer.callbacks+": "benchmarks.overhead.StepTimer",  # appended; the CLI's own callbacks stay
        "trainer.callbacks.output_dir": str(output),
    }
    command = [sys.executable, "-m", "project", "fit", *(f"--{key}={value}" for key, value in flags.items())]
    return [(command, {})]


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    """Waits for every process; kills them all when one fails (its peers would wait for it forever) or on timeout."""
    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc in procs):
        if time.monotonic() > deadline or any(proc.returncode for proc in procs):
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):  # each has its own session: the template's rank 1 too
                    os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    return [proc.wait() for proc in procs]


def run_side(side: str, config: Config, workdir: Path, threads: int | None) -> dict[str, Any]:
    env = child_env(config.nprocs, threads)
    log_path = workdir / f"{side}.log"
    (workdir / side).mkdir()  # each rank writes rank<N>.json here
    with open(log_path, "w") as log:
        env[LAUNCH_TIME] = str(time.time())
        start = time.perf_counter()
        procs = [
            subprocess.Popen(cmd, cwd=REPO, env={**env, **extra}, stdout=log, stderr=log, start_new_session=True)
            for cmd, extra in launches(side, config, workdir)
        ]
        codes = wait_all(procs, RUN_TIMEOUT_S)
        wall = time.perf_counter() - start
    if any(codes):
        raise RuntimeError(f"{side} {config.name} exited {codes}:\n{log_path.read_text()[-4000:]}")
    ranks = [json.loads((workdir / side / f"rank{rank}.json").read_text()) for rank in range(config.nprocs)]
    seconds = ranks[0]["seconds"]
    return {
        "steps_per_s": ranks[0]["steps"] / seconds,
        "samples_per_s": sum(rank["samples"] for rank in ranks) / seconds,
        "wall_s": wall,
        "time_to_first_step_s": max(rank["time_to_first_step_s"] for rank in ranks),
        "peak_rss_mb": max(rank["peak_rss_mb"] for rank in ranks),
        "gpu_peak_mb": max(rank["gpu_peak_mb"] for rank in ranks),
        "loss": statistics.mean(rank["loss"] for rank in ranks),
        "init_digest": ranks[0]["init_digest"],
    }


def bench(config: Config, repeats: int, threads: int | None) -> dict[str, Any]:
    """Alternates the sides' runs (so drifting machine load hits all of them) and takes medians."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(repeats):
        for side in SIDES:
            with tempfile.TemporaryDirectory() as workdir:
                runs[side].append(run_side(side, config, Path(workdir), threads))
    medians = {
        side: {k: statistics.median(run[k] for run in runs[side]) for k in runs[side][0] if k != "init_digest"}
        for side in SIDES
    }
    loss_diff = max(
        abs(run["loss"] - plain["loss"]) / max(abs(run["loss"]), abs(plain["loss"]), 1e-12)
        for side in SIDES
        for run, plain in zip(runs[side], runs["plain"], strict=True)
    )
    same_init = len({run["init_digest"] for side in SIDES for run in runs[side]}) == 1
    template_steps_per_s = medians["template"]["steps_per_s"]
    return {
        "name": config.name,
        **asdict(config),
        **medians,
        "runs": runs,
        "ratio_steps_per_s": template_steps_per_s / medians["plain"]["steps_per_s"],
        "ratio_to_bare_steps_per_s": template_steps_per_s / medians["bare"]["steps_per_s"],
        "loss_rel_diff": loss_diff,
        "same_init": same_init,
        "match": same_init and loss_diff <= LOSS_RTOL,
    }


def comparisons(results: dict[str, dict]) -> dict[str, float]:
    """(a) template defaults vs the classic DataLoader script; (b) 2-vs-1 scaling efficiency of the wide MLP."""
    found = {}
    for name, result in results.items():
        if result["pipeline"] == "dataloader" and (ours := results.get(name.replace("dataloader", "in-memory"))):
            found[f"defaults_vs_classic/{name}"] = ours["template"]["samples_per_s"] / result["plain"]["samples_per_s"]
        one = results.get(name.replace(f"-{result['nprocs']}p", "-1p"))
        if name.endswith("-wide") and result["nprocs"] > 1 and one:
            for side in SIDES:
                speedup = result[side]["samples_per_s"] / one[side]["samples_per_s"]
                found[f"scaling_efficiency/{side}/{name}"] = speedup / result["nprocs"]
    return found


COLUMNS = (  # header, key, width, format
    ("steps/s", "steps_per_s", 9, ".1f"),
    ("samples/s", "samples_per_s", 11, ".0f"),
    ("wall s", "wall_s", 8, ".2f"),
    ("1st step s", "time_to_first_step_s", 11, ".2f"),
    ("RSS MB", "peak_rss_mb", 8, ".0f"),
    ("GPU MB", "gpu_peak_mb", 8, ".0f"),
    ("loss", "loss", 11, ".6f"),
)


def table(results: dict[str, dict]) -> str:
    lines = [f"{'config':<24}{'side':<10}" + "".join(f"{head:>{width}}" for head, _, width, _ in COLUMNS)]
    for name, result in results.items():
        for side in SIDES:
            row = f"{name if side == 'plain' else '':<24}{side:<10}"
            row += "".join(f"{result[side][key]:>{width}{fmt}}" for _, key, width, fmt in COLUMNS)
            if side == "template":
                verdict = "ok" if result["match"] else "MISMATCH" + ("" if result["same_init"] else " (init)")
                row += f"  x{result['ratio_steps_per_s']:.2f} plain, x{result['ratio_to_bare_steps_per_s']:.2f} bare"
                row += f" steps/s, loss diff {result['loss_rel_diff']:.1e} {verdict}"
            lines.append(row)
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--wide-steps", type=int, default=40, help="steps per run of the wide (scaling) MLP")
    parser.add_argument("--wide-batch-size", type=int, default=256, help="per process, wide MLP")
    parser.add_argument("--cnn-steps", type=int, default=30, help="steps per run of the SmallCNN")
    parser.add_argument("--cnn-batch-size", type=int, default=128, help="per process, SmallCNN")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side and configuration (medians)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS per process (default: cores // processes)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these configurations")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 steps, 1 repeat")
    parser.add_argument("--output", default="runs/benchmark.json", help="results as JSON")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.wide_steps, args.cnn_steps, args.repeats = 10, 5, 3, 1
    return args


def main() -> int:
    args = parse_args()
    configs = all_configs(args)
    unknown = set(args.only or ()) - {config.name for config in configs}
    if unknown:
        sys.exit(f"unknown configurations {sorted(unknown)}; choose from {[config.name for config in configs]}")
    results, failed = {}, []
    for config in configs:
        if args.only and config.name not in args.only:
            continue
        try:
            result = results[config.name] = bench(config, args.repeats, args.threads)
        except RuntimeError as error:  # a side's run failed: say so, and keep the other rows' results
            print(f"failed {config.name}: {error}", file=sys.stderr, flush=True)
            failed.append(config.name)
            continue
        ratios = f"x{result['ratio_steps_per_s']:.2f} plain, x{result['ratio_to_bare_steps_per_s']:.2f} bare"
        print(f"done {config.name}: template steps/s {ratios}", flush=True)
    found = comparisons(results)
    print(table(results))
    print("\n".join(f"{key}: {value:.2f}" for key, value in found.items()))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"settings": vars(args), "configs": results, **found}, indent=2) + "\n")
    print(f"written to {args.output}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 0 if not failed and all(result["match"] for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
