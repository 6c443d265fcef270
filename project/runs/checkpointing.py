"""Checkpoints that survive crashes: atomic writes, weights-only reads, RNG states for an exact resume.

What a checkpoint restores: weights, optimizer and scheduler state, the loops' progress (epoch, step,
batch within the epoch), the in-memory loader's position (``TensorBatchLoader``) and, through
``gather_rng_states``, every rank's torch/CUDA/numpy/random generator states.
"""

import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from project.runtime.faults import first_line


class CheckpointError(ValueError):
    """A checkpoint file that is missing, unreadable, or holds more than weights."""


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
    mid-save leaves the previous checkpoint intact. (Lightning stages the file in the system temp folder:
    when the run folder is on another file system, a cluster's shared one, its final move is a plain copy.)
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's fsspec path
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")  # no *.ckpt name: never taken for a checkpoint
        with open(partial, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location, weights_only=True)
        return load_checkpoint_file(path, map_location)


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
