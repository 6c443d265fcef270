"""Checkpoints that survive crashes: atomic writes, weights-only reads, RNG states for an exact resume.

What a checkpoint restores: weights, optimizer and scheduler state, the loops' progress (epoch, step,
batch within the epoch), the in-memory loader's position (``TensorBatchLoader``) and, through
``gather_rng_states``, every rank's torch/CUDA/numpy/random generator states.

Two forms: a single file (DDP, one process), and a sharded folder (FSDP2, ``runtime/sharding.py``): torch's distributed
checkpoint (``.metadata`` and one ``__R_0.distcp`` shard per rank) with ``meta.pt`` beside it for the rest. A sharded
checkpoint loads on another number of ranks (DCP reshards), in a plain DDP or one-process run (gathered in memory), and
``python -m project consolidate`` turns it into a single file.
"""

import contextlib
import errno
import os
import pickle
import random
import shutil
import tempfile
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from lightning_utilities.core.apply_func import apply_to_collection

from trainfleet.checkpoints.writing import writing
from trainfleet.exit_codes import is_disk_full
from trainfleet.messages import first_line

METADATA_FILE = "meta.pt"  # beside a sharded checkpoint's shards: what is not a tensor shard (Lightning's name)


class CheckpointError(ValueError):
    """A checkpoint file that is missing, unreadable, or holds more than weights."""


class DiskFullError(OSError):
    """A checkpoint that did not fit on its disk (torch says only ``unexpected pos``): where, the space left, and the
    newest checkpoint beside it that is intact."""

    def __init__(self, path: Path, needed: int) -> None:
        intact = newest_intact_checkpoint(path.parent)
        super().__init__(
            errno.ENOSPC,
            f"disk full while saving {path}: {human_size(shutil.disk_usage(path.parent).free)} left on its file"
            f" system, the checkpoint needs about {human_size(needed)}; the newest intact checkpoint is"
            f" {intact or 'none (nothing saved yet)'}",
        )

    def __str__(self) -> str:
        return self.strerror


def human_size(size: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def tensor_bytes(checkpoint: dict[str, Any]) -> int:
    sizes: list[int] = []
    apply_to_collection(checkpoint, torch.Tensor, lambda tensor: sizes.append(tensor.nbytes))
    return sum(sizes)


def newest_intact_checkpoint(folder: Path, besides: Path | None = None) -> Path | None:
    """The newest ``*.ckpt`` file in FOLDER (other than BESIDES) that loads: what to resume from when the one meant
    is cut short."""
    candidates = sorted(folder.glob("*.ckpt"), key=lambda path: path.stat().st_mtime, reverse=True)
    for path in candidates:
        if path.is_file() and path != besides:
            try:
                load_checkpoint_file(path, mmap=True)
            except CheckpointError:
                continue
            return path
    return None


def is_sharded(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / ".metadata").is_file()


def check_checkpoint(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Refuses a checkpoint that is missing, unreadable or incomplete (a sharded one with a missing or cut-short
    shard), before anything is built; returns the shape of each of its weights."""
    path = Path(path)
    if path.is_dir():
        check_sharded(path)
        from torch.distributed.checkpoint import FileSystemReader

        tensors = FileSystemReader(path).read_metadata().state_dict_metadata
        prefix = "state_dict."
        return {key[len(prefix) :]: tuple(meta.size) for key, meta in tensors.items() if key.startswith(prefix)}
    try:
        state_dict = load_checkpoint_file(path, mmap=True).get("state_dict", {})  # mmap: the structure, not the tensors
    except CheckpointError as error:
        intact = newest_intact_checkpoint(path.parent, besides=path) if path.is_file() else None
        if intact is None:
            raise
        raise CheckpointError(f"{error}; the newest intact checkpoint beside it: --ckpt_path {intact}") from error
    return {key: tuple(value.shape) for key, value in state_dict.items()}


def check_sharded(path: Path) -> None:
    """Every shard ``.metadata`` names is there and long enough, and ``meta.pt`` too."""
    from torch.distributed.checkpoint import FileSystemReader

    if not (path / METADATA_FILE).is_file():
        raise CheckpointError(f"sharded checkpoint {path} is incomplete: {METADATA_FILE} is missing")
    try:
        storage = FileSystemReader(path).read_metadata().storage_data
    except Exception as error:  # a cut-short or foreign .metadata: torch raises whatever unpickling raised
        raise CheckpointError(f"sharded checkpoint {path}: .metadata is unreadable ({first_line(error)})") from error
    needed: dict[str, int] = defaultdict(int)
    for item in storage.values():
        needed[item.relative_path] = max(needed[item.relative_path], item.offset + item.length)
    for name, size in sorted(needed.items()):
        shard = path / name
        if not shard.is_file():
            raise CheckpointError(f"sharded checkpoint {path} is incomplete: shard {name} is missing")
        if shard.stat().st_size < size:
            raise CheckpointError(f"sharded checkpoint {path} is incomplete: shard {name} is cut short")


def checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """What a checkpoint holds besides tensors' contents (loops, callbacks' state), file or sharded folder alike."""
    path = Path(path)
    return load_checkpoint_file(path / METADATA_FILE if path.is_dir() else path, mmap=True)


def load_sharded_as_full(path: Path) -> dict[str, Any]:
    """A sharded checkpoint as a single-file one, in this process's memory (no process group needed): full weights,
    optimizer states keyed as ``torch.optim`` keys them."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    check_sharded(path)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        dcp_to_torch_save(path, Path(scratch) / "full.pt")
        tensors = load_checkpoint_file(Path(scratch) / "full.pt")
    checkpoint = load_checkpoint_file(path / METADATA_FILE)
    checkpoint["state_dict"] = tensors.pop("state_dict")
    count = sum(key.startswith("optimizer_") for key in tensors)
    checkpoint["optimizer_states"] = [by_position(tensors[f"optimizer_{index}"]) for index in range(count)]
    return checkpoint


def by_position(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (how DCP saves it) keyed by position, as ``load_state_dict`` wants."""
    positions: dict[str, int] = {}
    groups = [{**group, "params": [positions.setdefault(n, len(positions)) for n in group["params"]]}
              for group in state["param_groups"]]  # fmt: skip
    return {"state": {positions[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def consolidate(path: Path, output: Path) -> None:
    """Writes sharded checkpoint PATH as one file OUTPUT (for export, or a run without FSDP), atomically."""
    AtomicCheckpointIO().save_checkpoint(load_sharded_as_full(path), output)


def fsync_folder(folder: Path) -> None:
    """Makes a rename inside FOLDER durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def recover_interrupted_save(path: Path) -> None:
    """A sharded save killed between its two renames (``runtime/sharding.py``) leaves ``.NAME.old`` (the previous
    checkpoint) and ``.NAME.partial`` (complete: the renames start once every rank has written) but no NAME."""
    partial, old = path.with_name(f".{path.name}.partial"), path.with_name(f".{path.name}.old")
    if not path.exists() and old.is_dir():
        with contextlib.suppress(OSError):  # every process of a job looks: one of them puts it in place
            os.rename(partial if is_sharded(partial) and (partial / METADATA_FILE).is_file() else old, path)
    if path.exists():
        remove(old)


def remove(path: Path) -> None:
    """Removes PATH whatever it is (a checkpoint file or folder), if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def load_checkpoint_file(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """``torch.load`` restricted to tensors and plain values (never runs pickled code), with clear errors."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (FileNotFoundError, IsADirectoryError) as error:
        raise CheckpointError(f"checkpoint file not found: {path}") from error
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"refusing to load {path}: it holds pickled objects other than tensors and plain values,"
            f" and loading it could run code ({first_line(error)})"
        ) from error
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint {path} is corrupted or truncated: {first_line(error)}") from error


class AtomicCheckpointIO(TorchCheckpointIO):
    """Saves atomically and loads weights-only.

    The file is written beside its target, flushed to disk, then renamed over it, so a process killed
    mid-save leaves the previous checkpoint intact; a save interrupted by an exception (a second Ctrl-C) removes its
    partial file. (Lightning stages the file in the system temp folder: when the run folder is on another file
    system, a cluster's shared one, its final move is a plain copy.)

    ``stalls`` holds each save's start (``time.time()``) and the seconds its caller was blocked: what training lost to
    checkpoints, for the run's goodput record (runs/goodput.py).
    """

    def __init__(self) -> None:
        super().__init__()
        self.stalls: list[tuple[float, float]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        started, clock = time.time(), time.perf_counter()
        try:
            self._save(checkpoint, path, storage_options)
        finally:
            self.stalls.append((started, time.perf_counter() - clock))

    def _save(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """The write itself, atomic; the background writer runs it in its thread."""
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's fsspec path
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")  # no *.ckpt name: never taken for a checkpoint
        try:
            with writing(), open(partial, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, path)
        except BaseException as error:
            partial.unlink(missing_ok=True)
            if is_disk_full(error):
                raise DiskFullError(path, tensor_bytes(checkpoint)) from error
            raise

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location, weights_only=True)
        return load_checkpoint_file(path, map_location)


class AsyncAtomicCheckpointIO(AtomicCheckpointIO):
    """Saves atomically in a background thread, after a copy of every tensor taken at the step (the training stalls
    for the copy only). Chosen with ``--trainer.plugins`` and this class's path, as the cluster launchers do
    (``scripts/``); ``AtomicCheckpointIO``, synchronous, is the default otherwise.

    Written by hand because Lightning's ``AsyncCheckpointIO`` queues any number of copies and offers no wait short of
    its teardown: here one write at most is pending, and it is finished before the next save, a removal or a load, at
    teardown, and before a failed or preempted run exits (``runtime/faults.py``'s ``finish_pending_save``). A process
    killed during the write leaves only the hidden ``.NAME.partial`` file and the previous checkpoint intact.
    """

    def __init__(self) -> None:
        super().__init__()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._staging: list[torch.Tensor] = []  # the last save's copies, reused (no new pages) when the shapes match

    def _save(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """The wait for the previous write and the copy: the caller's stall (``stalls``); the write goes on behind."""
        self.finish_pending_save()  # the staging copies are free again
        snapshot = self._copy(checkpoint)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending = self._executor.submit(super()._save, snapshot, path, storage_options)

    def _copy(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """CHECKPOINT with every tensor copied, into the previous save's copies when the tensors are alike (a fresh
        copy of 100 MB costs its page faults too: most of the stall)."""
        tensors: list[torch.Tensor] = []
        apply_to_collection(checkpoint, torch.Tensor, tensors.append)
        alike = len(tensors) == len(self._staging) and all(
            (t.shape, t.dtype, t.device) == (c.shape, c.dtype, c.device)
            for t, c in zip(tensors, self._staging, strict=True)
        )
        if not alike:
            self._staging = [tensor.detach().clone() for tensor in tensors]
        else:
            for tensor, copy in zip(tensors, self._staging, strict=True):
                copy.copy_(tensor.detach())
        staged = iter(self._staging)
        return apply_to_collection(checkpoint, torch.Tensor, lambda _: next(staged))

    def finish_pending_save(self) -> None:
        """Waits for the write in progress; raises its error, if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def remove_checkpoint(self, path: Any) -> None:
        self.finish_pending_save()
        super().remove_checkpoint(path)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        self.finish_pending_save()
        return super().load_checkpoint(path, map_location, weights_only)

    def teardown(self) -> None:
        try:
            self.finish_pending_save()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


def gather_rng_states(trainer: Trainer) -> list[dict[str, Any]]:
    """Every rank's RNG states, in rank order, for the checkpoint (each rank draws its own numbers).

    Lightning's checkpoints hold none, so after a resume dropout and random augmentation would draw other
    numbers than the uninterrupted run. Called on every rank (``on_save_checkpoint``): it is a collective.
    """
    states = [rng_states()]
    if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
        own, states = states[0], [None] * trainer.world_size
        dist.all_gather_object(states, own)
    return states


def restore_rng_states(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """Restores this rank's RNG states when ``fit`` resumes from a checkpoint saved by as many ranks."""
    states = checkpoint.get("rng_states")
    if states is None or trainer.state.fn != TrainerFn.FITTING:
        return
    if len(states) != trainer.world_size:
        rank_zero_warn(f"RNG states not restored: saved by {len(states)} ranks, resumed on {trainer.world_size}")
        return
    set_rng_states(states[trainer.global_rank])


def rng_states() -> dict[str, Any]:
    """This process's generator states, as tensors and plain values (weights-only loadable)."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached_gaussian),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
