"""LitData's ``StreamingDataset`` for the items ``scripts/make_shards.py`` writes, an indexed view of it, and LitData's
loader going on to the next epoch after a resumed one."""

from collections.abc import Callable
from typing import Any

from litdata import StreamingDataLoader, StreamingDataset
from torch.utils.data import Dataset

from trainfleet.data.samplers import sample_seed
from trainfleet.data.transforms import seeded


class ImageShards(StreamingDataset):
    """Yields ``(image, label)`` from ``{"image", "label"}`` items, the image transformed with a per-sample seed.

    The seed comes from the data seed, LitData's epoch and the sample's index, so augmentation is the same after a
    mid-epoch resume (LitData restores its position, not its workers' random generators).
    """

    def __init__(
        self, input_dir: str, image_transform: Callable | None = None, seeded: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(input_dir, **kwargs)
        self.image_transform = image_transform
        self.seeded = seeded  # False: the transform draws no random numbers (no augmentation), so it runs as is

    def __getitem__(self, index: Any) -> tuple[Any, int]:
        item = super().__getitem__(index)
        if not isinstance(item, dict) or sorted(item) != ["image", "label"]:
            raise ValueError(
                f"shards at {self.input_dir.path or self.input_dir.url} hold items of another schema"
                f" ({type(item).__name__}); expected dicts with keys image and label, as scripts/make_shards.py writes"
            )
        image = item["image"]
        if self.image_transform is None:
            return image, item["label"]
        if not self.seeded:
            return self.image_transform(image), item["label"]
        number = index if isinstance(index, int) else index.index
        image = seeded(self.image_transform, image, sample_seed(self.seed, self.current_epoch, number))
        return image, item["label"]


class Indexed(Dataset):
    """A map-style view of ``ImageShards``, so evaluation can use the exact sampler (each sample on one rank)."""

    def __init__(self, shards: ImageShards, length: int) -> None:
        self.shards = shards
        self.length = length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.shards[index]

    def __len__(self) -> int:
        return self.length


class ResumableStreamingDataLoader(StreamingDataLoader):
    """LitData's ``StreamingDataLoader``, which goes on to the next epoch after one resumed from a checkpoint.

    LitData clears its resume flag (``restore``) only when an epoch's iterator runs out; Lightning knows the length and
    stops asking before that, so after a mid-epoch resume the flag stayed set, LitData's epoch did not advance and the
    next epoch trained another order than the uninterrupted run's. A new iterator after the resumed one clears it.
    """

    resumed_epoch_started = False
    keep_position = True  # False: a position loaded from a checkpoint is dropped (the world size changed)

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        if self.keep_position:
            super().load_state_dict(obj)

    def __iter__(self) -> Any:
        if self.restore and self.resumed_epoch_started:
            self.restore = False
        self.resumed_epoch_started = self.restore
        return super().__iter__()
