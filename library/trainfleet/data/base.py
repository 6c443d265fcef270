"""The base data module: any map-style ``Dataset``, split, transformed and sharded across ranks.

The Trainer runs with ``use_distributed_sampler=False``, so these samplers are the ones used:
``DistributedSampler`` for training (shuffled, seeded, reshuffled each epoch by Lightning's ``set_epoch``
call) and ``ExactDistributedSampler`` for val/test/predict, so every sample is counted once.
Batches come from ``TensorBatchLoader`` (tensors in memory, no transform: slicing, the fast path) or from
torchdata's ``StatefulDataLoader`` (anything else), whose position Lightning saves in every checkpoint,
so a run resumed mid-epoch continues with the very next batch; one resumed at an epoch's end or last batch starts the
next epoch, in that epoch's order (``resume_point``). Every DataLoader worker is seeded from ``seed``, the
epoch, the rank and the worker (a loader generator seeded with ``seed`` draws a base seed per epoch; Lightning's
``worker_init_fn`` mixes in the rank and worker); random augmentation draws from a seed per sample and epoch
(``SeededSampler``), so it survives a resume and does not depend on the worker count or the world size.

A checkpoint also holds the training order's global position (``state_dict``: the epoch, its order's seed and how
many samples of it every rank together has trained), so a run resumed inside an epoch on another number of ranks
trains the rest of that epoch's samples, each once, split across its ranks (``ResumableDistributedSampler``).
"""

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import Dataset, Sampler, Subset, TensorDataset

from trainfleet.data.loaders import ResumableDataLoader, TensorBatchLoader
from trainfleet.data.samplers import ExactDistributedSampler, Remainder, ResumableDistributedSampler, SeededSampler
from trainfleet.data.transforms import Transformed, augments, compose
from trainfleet.lightning_internals import batches_trained, resume_point, shift_batch_count
from trainfleet.messages import report

SPLITS = ("train", "val", "test")
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes no more (a seed plus the epoch, in the sampler)


class BaseDataModule(LightningDataModule):
    """Classification data from map-style datasets of ``(image, label)`` pairs, returned by ``datasets``.

    Subclasses return ``train`` and optionally ``val``/``test`` from ``datasets``; the missing ones are split off
    ``train`` with ``split_seed``. They set ``num_classes`` and ``input_shape`` (``discover`` finds them).

    Args:
        train_transforms: applied to training samples, in order (e.g. ``torchvision.transforms.v2`` class paths).
        eval_transforms: applied to val/test/predict samples.
        batch_size: samples per rank per step (the global batch is ``batch_size * world_size``).
        val_fraction, test_fraction: shares of ``train`` held out when there is no separate val/test set.
        split_seed: seeds that split, independently of the training seed.
        shuffle: shuffle training data (reshuffled every epoch, the same on every rank).
        seed: seeds the training order (``DistributedSampler`` mixes in the epoch) and augmentation.
        drop_last: drop the last incomplete training batch of each epoch.
        in_memory: slice batches out of tensors where a split is a ``TensorDataset`` without transforms (fast);
            ``False`` always uses a DataLoader.
        on_device: with ``in_memory`` on a GPU, keep those tensors on the GPU (moved once per rank) and slice batches
            there: no copy and no host sync per step. ``False`` for data larger than GPU memory.
        num_workers: DataLoader worker processes per rank (0: load in the training process).
        pin_memory: page-locked batches for faster copies to the GPU (only when training on GPUs); Lightning copies
            batches with ``non_blocking=True``, which overlaps with compute only from page-locked memory.
        persistent_workers: keep workers alive between epochs (with ``num_workers > 0``).
        prefetch_factor: batches each worker loads ahead (with ``num_workers > 0``; ``None``: torch's default, 2).
        snapshot_every_n_steps: how often loader workers send their position to the training process (torchdata's
            ``StatefulDataLoader``; its default, every batch, costs images/s with several workers: see
            docs/performance.md). A checkpoint between two snapshots stays exact: on resume the loader loads and
            skips the batches since.
        predict_path: new inputs for ``predict`` (a folder of images, a table: what ``read_inputs`` of the data
            module reads); ``None``: ``predict`` runs on the test split.
    """

    num_classes: int
    input_shape: tuple[int, ...]
    classes: list[str] | None = None  # the class names, where the data has them (predictions name the class)

    def __init__(
        self,
        train_transforms: list[Callable] | None = None,
        eval_transforms: list[Callable] | None = None,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        in_memory: bool = True,
        on_device: bool = True,
        num_workers: int = 0,
        pin_memory: bool = True,
        persistent_workers: bool = True,
        prefetch_factor: int | None = None,
        snapshot_every_n_steps: int = 64,
        predict_path: str | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(
                f"need 0 <= val_fraction, 0 <= test_fraction and a sum below 1; got {val_fraction} and {test_fraction}"
            )
        check_num_workers(num_workers)
        if prefetch_factor is not None and (prefetch_factor < 1 or num_workers == 0):
            raise ValueError(f"prefetch_factor must be >= 1 and needs num_workers > 0; got {prefetch_factor}")
        for name, value in (("split_seed", split_seed), ("seed", seed)):
            if not 0 <= value <= MAX_SEED:  # torch's generators overflow past it, when the first epoch starts
                raise ValueError(f"{name} must be in [0, {MAX_SEED}], got {value}")
        if snapshot_every_n_steps < 1:
            raise ValueError(f"snapshot_every_n_steps must be >= 1, got {snapshot_every_n_steps}")
        if predict_path is not None and type(self).read_inputs is BaseDataModule.read_inputs:
            raise ValueError(f"{type(self).__name__} cannot read new inputs: predict_path needs a data module that can")
        if predict_path is not None and not os.path.exists(predict_path):
            raise ValueError(f"predict_path not found: {predict_path}")
        # Objects stay attributes; num_classes and input_shape would clash with the model's (linked) values.
        ignored = ["train", "val", "test", "train_transforms", "eval_transforms", "num_classes", "input_shape"]
        self.save_hyperparameters(ignore=ignored)
        self.transforms = {"train": compose(train_transforms), "val": compose(eval_transforms)}
        self.transforms["test"] = self.transforms["val"]
        self.augmented = augments(train_transforms, eval_transforms)  # training samples then carry seeds
        self.splits: dict[str, Dataset] = {}
        self.predict_names: list[str] | None = None  # the inputs of predict_path, by index, once loaded
        self.unreadable_inputs: list[tuple[str, str]] = []  # predict_path's inputs that could not be read, and why
        self.predict_sampler: Sampler | None = None
        self.train_sampler: ResumableDistributedSampler | None = None
        self.saved_order: dict[str, Any] | None = None  # the checkpoint's training position (``state_dict``)
        self.rest_begins = 0  # Lightning's batch count where the rest of a re-split epoch begins

    def datasets(self) -> dict[str, Dataset]:
        """The untransformed datasets by split name; ``train`` is required, missing val/test are split off it."""
        raise NotImplementedError

    def read_inputs(self, path: Path) -> tuple[Dataset, list[str]]:
        """The new inputs at ``path`` (``predict_path``) as ``(input, any label)`` pairs, untransformed, and their names
        (a file's path, a row's number); data modules that can read new inputs implement it."""
        raise NotImplementedError

    def discover(self, train: Dataset, num_classes: int | None = None, input_shape: tuple | None = None) -> None:
        """Sets ``num_classes`` and ``input_shape``: as given, else from ``train.classes`` and its first sample."""
        classes = getattr(train, "classes", None)
        self.classes = [str(name) for name in classes] if classes is not None else None
        if num_classes is None and not hasattr(self, "num_classes"):
            if not hasattr(train, "classes"):
                raise ValueError(f"give data.init_args.num_classes: {type(train).__name__} has no `classes`")
            num_classes = len(train.classes)
        if input_shape is None and not hasattr(self, "input_shape"):
            image, _ = train[0]
            transform = self.transforms["val"]
            input_shape = (transform(image) if transform else image).shape
        if num_classes is not None:
            self.num_classes = num_classes
        if input_shape is not None:
            self.input_shape = tuple(input_shape)

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        parts = dict(self.datasets())
        missing = {name: getattr(self.hparams, f"{name}_fraction") for name in ("test", "val") if name not in parts}
        if missing:
            parts.update(split(parts["train"], missing, self.hparams.split_seed))
        self.splits = {
            name: Transformed(parts[name], self.transforms[name]) if self.transforms[name] else parts[name]
            for name in SPLITS
        }

    def train_dataloader(self) -> Iterable:
        dataset = self.splits["train"]
        num_replicas, rank = self._ranks()
        batch_size, drop_last = self.hparams.batch_size, self.hparams.drop_last
        self.train_sampler = ResumableDistributedSampler(
            dataset, num_replicas, rank, self.hparams.shuffle, self.hparams.seed, batch_size, drop_last
        )
        sampler: Sampler = self.train_sampler
        if isinstance(dataset, Transformed) and self.augmented:
            sampler = SeededSampler(sampler, self.hparams.seed)
        # A resumed run: Lightning makes the epoch's iterator (a StatefulDataLoader draws the order then, workers take
        # indices ahead) before its set_epoch call, so the sampler must already be at the epoch it resumes into.
        epoch, mid_epoch = resume_point(self.trainer) if self.trainer else (0, False)
        if not mid_epoch:
            self._start_count_afresh(num_replicas)
        resplit = mid_epoch and self._resume_rest(epoch)
        sampler.set_epoch(epoch)
        loader = self._loader(dataset, sampler, drop_last, mid_epoch=mid_epoch and not resplit)
        if resplit:
            self._count_from_rest(len(loader), epoch)
        return loader

    def state_dict(self) -> dict[str, Any]:
        """The training order's global position, in every checkpoint: the epoch, its order's seed, and how many
        samples of that order every rank together has trained (a prefix of it), not each rank's position, so a run
        resumed on another number of ranks can split the rest. ``resumed_from``: where this run's part of the epoch
        began (0 unless it is itself a re-split epoch)."""
        sampler, trainer = self.train_sampler, self.trainer
        if sampler is None or trainer is None:
            return {}
        epoch = trainer.current_epoch
        remainder = sampler.resumed(epoch)
        steps = batches_trained(trainer) - (self.rest_begins if remainder else 0)
        order = {"epoch": epoch, "seed": remainder.seed if remainder else sampler.seed, "shuffle": sampler.shuffle}
        order |= {"size": len(sampler.dataset), "trained": sampler.trained(epoch, steps)}
        order |= {"world_size": sampler.num_replicas, "resumed_from": remainder.start if remainder else 0}
        return {"train_order": order}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.saved_order = state_dict.get("train_order")

    def _resume_rest(self, epoch: int) -> bool:
        """Whether the resumed EPOCH is re-split: it began on another number of ranks (or was itself re-split); then
        the sampler starts after the samples trained. Not when it began on as many ranks: the loader's own saved
        position resumes it to bit-identical weights."""
        saved, sampler = self.saved_order, self.train_sampler
        assert sampler is not None
        if saved is None or saved["epoch"] != epoch:
            return False
        if saved["world_size"] == sampler.num_replicas and saved["resumed_from"] == 0:
            return False
        if saved["size"] != len(sampler.dataset) or saved["shuffle"] != sampler.shuffle:
            say_once(
                f"epoch {epoch} resumes at its step {batches_trained(self.trainer)} in this run's order: the checkpoint"
                f" trained another order ({saved['size']} samples, shuffle {saved['shuffle']}; this run:"
                f" {len(sampler.dataset)}, shuffle {sampler.shuffle})"
            )
            return False
        sampler.resume_at(Remainder(epoch, saved["trained"], saved["seed"]))
        return True

    def _start_count_afresh(self, num_replicas: int) -> None:
        """After a checkpoint from an epoch's last batch on another number of ranks, the next epoch's batch count
        starts at 0. Lightning starts it afresh only when the checkpoint's count is this run's epoch length, which
        another world size changes: 2 ranks' 10 steps, resumed on 1 rank (20 a fresh epoch), trained 10 steps of the
        next epoch, its last 618 samples of 1,258."""
        saved, trainer = self.saved_order, self.trainer
        if trainer and saved and saved["world_size"] != num_replicas and (trained := batches_trained(trainer)):
            shift_batch_count(trainer, -trained)

    def _count_from_rest(self, length: int, epoch: int) -> None:
        """Sets Lightning's batch count so that the epoch's LENGTH (its fresh length on these ranks, which Lightning
        reads) ends with the rest's last step, and says what the resumed epoch trains, in one line."""
        sampler, saved = self.train_sampler, self.saved_order
        assert sampler is not None and saved is not None and self.trainer is not None
        steps = sampler.steps(epoch)
        self.rest_begins = length - steps
        shift_batch_count(self.trainer, self.rest_begins - batches_trained(self.trainer))
        size, trained = saved["size"], saved["trained"]
        share, padding = sampler.rest(epoch)
        rule = f", {padding} of them repeated so that every rank runs as many steps" if padding else ""
        if sampler.batch_drop_last:
            rule = f"; drop_last: {size - trained - len(share) * sampler.num_replicas} left out, whole batches only"
        say_once(
            f"epoch {epoch} was checkpointed on {ranks(saved['world_size'])} and resumes on {sampler.num_replicas}: the"
            f" {size - trained} samples of its {size} not yet trained, each once{rule}, split across"
            f" {ranks(sampler.num_replicas)} ({steps} steps of up to {sampler.batch_size} a rank)"
        )

    def val_dataloader(self) -> Iterable:
        return self._eval_loader("val")

    def test_dataloader(self) -> Iterable:
        return self._eval_loader("test")

    def predict_dataloader(self) -> Iterable:
        """The test split, or the new inputs at ``predict_path``. Its sampler stays here, ``predict_sampler``: the
        order the predictions come in (Lightning rebuilds a DataLoader for predict, its ``sampler`` then not ours)."""
        inputs = self.splits["test"]
        if self.hparams.predict_path is not None:
            inputs, self.predict_names = self.read_inputs(Path(self.hparams.predict_path))
            if self.transforms["val"]:
                inputs = Transformed(inputs, self.transforms["val"])
        self.predict_sampler = ExactDistributedSampler(inputs, *self._ranks())
        return self._loader(inputs, self.predict_sampler)

    def _eval_loader(self, name: str) -> Iterable:
        num_replicas, rank = self._ranks()
        return self._loader(self.splits[name], ExactDistributedSampler(self.splits[name], num_replicas, rank))

    def _ranks(self) -> tuple[int, int]:
        """(world size, global rank) from the Trainer; without one, the process group's (benchmarks/data.py),
        or (1, 0)."""
        if self.trainer is None:
            return (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
        return self.trainer.world_size, self.trainer.global_rank

    def _gpu(self) -> torch.device | None:
        """The GPU this rank trains on; None on CPUs or without a Trainer."""
        device = self.trainer.strategy.root_device if self.trainer is not None else None
        return device if device is not None and device.type == "cuda" else None

    def _pin_memory(self) -> bool:
        return self.hparams.pin_memory and self._gpu() is not None

    def _loader(
        self,
        dataset: Dataset,
        sampler: Sampler,
        drop_last: bool = False,
        mid_epoch: bool = False,
    ) -> Iterable:
        """A loader for DATASET in SAMPLER's order; MID_EPOCH: it resumes at the position a checkpoint saved (else the
        sampler has it, or the epoch starts)."""
        if self.hparams.in_memory and isinstance(dataset, TensorDataset):
            device = self._gpu() if self.hparams.on_device else None
            return TensorBatchLoader(
                dataset.tensors, sampler, self.hparams.batch_size, drop_last, device, mid_epoch=mid_epoch
            )
        workers = self.hparams.num_workers
        return ResumableDataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=workers,
            pin_memory=self._pin_memory(),
            persistent_workers=self.hparams.persistent_workers and workers > 0,
            prefetch_factor=self.hparams.prefetch_factor,
            snapshot_every_n_steps=self.hparams.snapshot_every_n_steps,
            # Workers' base seeds come from here, not from the global generator that dropout draws from (a resumed
            # run would otherwise draw one more number from it); Lightning's worker_init_fn mixes in rank and worker.
            generator=torch.Generator().manual_seed(self.hparams.seed),
            mid_epoch=mid_epoch,
        )


@rank_zero_only
def say_once(message: str) -> None:
    report(message)


def ranks(count: int) -> str:
    return f"{count} rank" if count == 1 else f"{count} ranks"


def split(dataset: Dataset, fractions: dict[str, float], seed: int) -> dict[str, Dataset]:
    """Splits ``fractions`` (name: share, in order) off ``dataset`` by a seeded permutation; the rest is ``train``."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    parts, start = {}, 0
    for name, fraction in fractions.items():
        count = round(fraction * len(order))
        parts[name], start = order[start : start + count], start + count
    parts["train"] = order[start:]
    return {name: subset(dataset, indices) for name, indices in parts.items()}


def subset(dataset: Dataset, indices: torch.Tensor) -> Dataset:
    """The samples at ``indices``: copied tensors for a ``TensorDataset`` (fast path), a view otherwise."""
    if isinstance(dataset, TensorDataset):
        return TensorDataset(*(tensor[indices] for tensor in dataset.tensors))
    return Subset(dataset, indices.tolist())


def check_num_workers(num_workers: int) -> None:
    """Refuses a worker count below 0 or above this process's CPU cores (each worker is a process)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not 0 <= num_workers <= cores:
        raise ValueError(f"num_workers must be between 0 and the {cores} CPU cores available, got {num_workers}")
