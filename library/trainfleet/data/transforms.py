"""Per-split transforms applied where samples are loaded, with per-sample seeds for random augmentation."""

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset


def compose(transforms: Sequence[Callable] | None) -> Callable | None:
    """Chains the config's transforms (e.g. ``torchvision.transforms.v2`` class paths) into one callable."""
    return Chain(transforms) if transforms else None


def augments(train: Sequence[Callable] | None, evaluation: Sequence[Callable] | None) -> bool:
    """Whether the training transforms may draw random numbers: they are not the evaluation ones. The presets share
    their transform objects between the two when they add no augmentation; anything else counts as random, and its
    samples carry seeds (a cost per sample, saved where nothing draws)."""
    return bool(train) and list(train) != list(evaluation or [])


class Chain:
    """Applies callables in order (``v2.Compose`` without importing torchvision; picklable for workers)."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: Any) -> Any:
        for transform in self.transforms:
            image = transform(image)
        return image


class Transformed(Dataset):
    """``(transform(image), label)`` for each ``(image, label)`` of ``dataset``.

    Indexed by ``(index, seed)`` (``SeededSampler``, training), the transform draws from a generator seeded with
    ``seed``: the same sample gets the same augmentation whatever the worker, world size or resume point.
    Indexed by a plain index (evaluation), it runs as is.
    """

    def __init__(self, dataset: Dataset, transform: Callable) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int | tuple[int, int]) -> tuple[Any, Any]:
        if isinstance(index, tuple):
            index, seed = index
            image, label = self.dataset[index]
            return seeded(self.transform, image, seed), label
        image, label = self.dataset[index]
        return self.transform(image), label


def seeded(transform: Callable, image: Any, seed: int) -> Any:
    """``transform(image)`` with torch's global CPU generator seeded with ``seed``, restored afterwards.

    The CPU generator alone: ``torch.manual_seed`` (and ``fork_rng``) also visit every accelerator, which costs far
    more per sample with a CUDA build of torch.
    """
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(seed)
    try:
        return transform(image)
    finally:
        generator.set_state(state)


class ImageToFloat:
    """A PIL image or uint8 tensor as a float CxHxW tensor in [0, 1]: ``v2.ToImage`` and then
    ``v2.ToDtype(float32, scale=True)``, called as their functional forms. The same numbers, without the two transform
    objects' input flattening and dispatch per image (docs/performance.md).
    """

    def __call__(self, image: Any) -> torch.Tensor:
        from torchvision.transforms.v2.functional import to_dtype, to_image

        return to_dtype(to_image(image), torch.float32, scale=True)


def presets(
    image_size: int | None, crop_padding: int, horizontal_flip: bool, mean: list | None, std: list | None
) -> tuple[list, list]:
    """(train, eval) transforms: resize and center-crop, random crop and flip (train), to float tensors, normalize."""
    from torchvision.transforms import v2

    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be >= 1 (pixels; null: keep the size), got {image_size}")
    if crop_padding < 0:
        raise ValueError(f"crop_padding must be >= 0 (pixels; 0: no random crop), got {crop_padding}")
    if crop_padding and image_size is None:
        raise ValueError("crop_padding needs image_size (the size to crop back to)")
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std, or neither")
    resize = [v2.Resize(image_size), v2.CenterCrop(image_size)] if image_size else []
    tensor = [ImageToFloat()] + ([v2.Normalize(mean, std)] if mean else [])
    augment = [v2.RandomCrop(image_size, padding=crop_padding)] if crop_padding else []
    augment += [v2.RandomHorizontalFlip()] if horizontal_flip else []
    return resize + augment + tensor, resize + tensor
