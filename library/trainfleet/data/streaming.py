"""LitData shards, from a local folder or object storage (``s3://...``), for data beyond one node's disk.

The ``stream`` extra (litdata), imported when the module is built. Shards are written by ``scripts/make_shards.py``.
"""

import json
from pathlib import Path
from typing import Any

import fsspec
import torch
from torch.utils.data import Dataset

from trainfleet.data.base import BaseDataModule, ranks, say_once
from trainfleet.data.transforms import presets
from trainfleet.lightning_internals import batches_trained, resume_point, shift_batch_count

SCHEMA_FILE = "dataset.json"  # written by scripts/make_shards.py beside the splits: class names, sample counts
ITEM_KEYS = ["image", "label"]


class StreamingDataModule(BaseDataModule):
    """Training streams ``root/train`` with LitData's ``StreamingDataLoader``; evaluation reads ``root/val`` and
    ``root/test`` by index with the exact sampler.

    Training: LitData shards the chunks across ranks and workers, reshuffles every epoch (``shuffle``, ``seed``) and,
    with several ranks, drops the last samples so every rank runs the same number of steps (as DDP requires).
    Its loader's position goes into every checkpoint, so a run resumed mid-epoch continues exactly; augmentation draws
    from a seed per sample and epoch. Evaluation does not go through LitData's sharding, which also drops samples
    with several ranks (``drop_last``): every sample is counted exactly once at any world size.

    Args:
        root: a folder or URL holding ``train/``, ``val/``, ``test/`` shards and ``dataset.json``.
        cache_dir: where chunks of a remote ``root`` are cached (``None``: LitData's default).
        max_cache_size: the most disk the cache may use (e.g. ``"100GB"``).
        num_classes: classes to predict (``None``: read from ``dataset.json``).
        input_shape: one transformed sample's shape (``None``: read from the first training sample).
        image_size, crop_padding, horizontal_flip, mean, std: the transform presets, as for
            ``ImageFolderDataModule`` (images become float tensors in [0, 1]; tensors pass unchanged).
        **kwargs: the ``BaseDataModule`` arguments (transforms, batch_size, shuffle, seed, num_workers, ...);
            ``val_fraction``, ``test_fraction``, ``split_seed`` and ``in_memory`` do not apply: the shards hold
            their splits.
    """

    def __init__(
        self,
        root: str,
        cache_dir: str | None = None,
        max_cache_size: str = "100GB",
        num_classes: int | None = None,
        input_shape: tuple[int, ...] | None = None,
        image_size: int | None = None,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        **kwargs,
    ) -> None:
        # kwargs go on to super().__init__ as they are: jsonargparse follows them there for the accepted keys.
        train, evaluate = presets(image_size, crop_padding, horizontal_flip, mean, std)
        kwargs["train_transforms"] = kwargs.get("train_transforms") or train
        kwargs["eval_transforms"] = kwargs.get("eval_transforms") or evaluate
        super().__init__(**kwargs)
        self.root = root.rstrip("/")
        if "://" not in root:
            check_shards(Path(root))
        if num_classes is None:
            with fsspec.open(f"{self.root}/{SCHEMA_FILE}") as file:
                num_classes = len(json.load(file)["classes"])
        self.discover(self.shards("train"), num_classes, input_shape)

    def shards(self, split: str, transform: Any = None, **kwargs) -> Dataset:
        """``root/split`` as an ``ImageShards`` (a LitData ``StreamingDataset``)."""
        from trainfleet.data.shards import ImageShards  # imports litdata, an optional extra

        options = {"cache_dir": self.hparams.cache_dir, "max_cache_size": self.hparams.max_cache_size}
        return ImageShards(f"{self.root}/{split}", image_transform=transform, **options, **kwargs)

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        with fsspec.open(f"{self.root}/{SCHEMA_FILE}") as file:
            counts = json.load(file)["samples"]
        from trainfleet.data.shards import Indexed

        for name in ("val", "test"):
            self.splits[name] = Indexed(self.shards(name, self.transforms[name], seeded=False), counts[name])

    def train_dataloader(self) -> Any:
        from trainfleet.data.shards import ResumableStreamingDataLoader

        shuffle, seed = self.hparams.shuffle, self.hparams.seed
        drop_last = self.hparams.drop_last or None  # None: LitData's default, True with several ranks
        options = {"shuffle": shuffle, "seed": seed, "drop_last": drop_last, "seeded": self.augmented}
        shards = self.shards("train", self.transforms["train"], **options)
        workers = self.hparams.num_workers
        loader = ResumableStreamingDataLoader(
            shards,
            batch_size=self.hparams.batch_size,
            num_workers=workers,
            pin_memory=self._pin_memory(),
            persistent_workers=self.hparams.persistent_workers and workers > 0,
            prefetch_factor=self.hparams.prefetch_factor,
            # Workers' base seeds come from here, not from the global generator that dropout draws from (a resumed
            # run would otherwise draw one more number from it).
            generator=torch.Generator().manual_seed(seed),
        )
        # LitData counts epochs from 1 as each starts; a resumed run starts at its epoch (a mid-epoch checkpoint's
        # loader state, loaded after this, sets it too). Its own count would restart from the first.
        epoch, mid_epoch = resume_point(self.trainer) if self.trainer else (0, False)
        loader.current_epoch = epoch
        if mid_epoch and self._world_size_changed(epoch):
            self._restart_epoch(loader, epoch)
        return loader

    def state_dict(self) -> dict[str, Any]:
        """The epoch and world size a checkpoint was written in (LitData's loader state holds its position)."""
        if self.trainer is None:
            return {}
        return {"train_order": {"epoch": self.trainer.current_epoch, "world_size": self.trainer.world_size}}

    def _world_size_changed(self, epoch: int) -> bool:
        saved = self.saved_order
        return saved is not None and saved["epoch"] == epoch and saved["world_size"] != self.trainer.world_size

    def _restart_epoch(self, loader: Any, epoch: int) -> None:
        """The rule where the rest of an epoch cannot be split across another number of ranks: LitData's position is
        each rank's and worker's, in chunks assigned by the world size, and this template does not re-split it
        (LitData 0.2.76's own elastic resume rounds the samples trained down to a whole global batch, untested here).
        The epoch starts again from its start, in its order, with the count of its batches back at 0; said in a line."""
        assert self.saved_order is not None and self.trainer is not None
        done = batches_trained(self.trainer)
        loader.keep_position = False
        shift_batch_count(self.trainer, -done)
        say_once(
            f"epoch {epoch} was checkpointed on {ranks(self.saved_order['world_size'])} and resumes on"
            f" {self.trainer.world_size}: LitData's streaming position cannot be split across another number of ranks,"
            f" so the epoch starts again from its first step (the samples of its {done} steps trained before are"
            " trained again)"
        )


def check_shards(root: Path) -> None:
    """Refuses a local ``root`` without the splits or with items other than ``{"image", "label"}``, naming it."""
    if not (root / SCHEMA_FILE).is_file():
        raise ValueError(f"no shards at {root}: {root / SCHEMA_FILE} is missing (scripts/make_shards.py writes it)")
    for split in ("train", "val", "test"):
        index = root / split / "index.json"
        if not index.is_file():
            raise ValueError(f"no shards at {root / split}: {index} is missing")
        config = json.loads(index.read_text())["config"]
        if sorted(config.get("types") or {}) != ITEM_KEYS:
            raise ValueError(
                f"shards at {root / split} hold items of another schema ({config['data_format']}); expected dicts"
                f" with keys {ITEM_KEYS}, as scripts/make_shards.py writes"
            )
