"""Samplers that shard a data set across ranks.

Training uses torch's ``DistributedSampler`` as it is (shuffled, seeded, reshuffled by ``set_epoch``,
padded so every rank runs the same number of steps, which DDP needs). Evaluation uses
``ExactDistributedSampler``: Lightning's injected sampler pads evaluation sets with duplicates,
which makes distributed accuracy wrong whenever ``len(dataset) % world_size != 0``.
``SeededSampler`` gives each training sample the seed of its augmentation.
"""

from collections.abc import Iterator, Sized

from torch.utils.data import Sampler


class ExactDistributedSampler(Sampler[int]):
    """Gives every index to exactly one rank, in order, with no padding.

    Ranks may get one sample more or less than each other; evaluation has no gradient sync,
    so uneven shards are safe as long as no per-step collective runs (metrics sync once, at compute).
    """

    def __init__(self, data_source: Sized, num_replicas: int = 1, rank: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.num_samples_total = len(data_source)
        self.num_replicas = num_replicas
        self.rank = rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.num_samples_total, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.num_samples_total, self.num_replicas))


class SeededSampler(Sampler[tuple[int, int]]):
    """Yields ``(index, seed)`` pairs: each training sample carries the seed its random augmentation draws from.

    The seed depends only on the data seed, the epoch and the index (``sample_seed``), not on the rank, the worker
    or how many samples came before, so augmentation is reproducible, differs per sample and per epoch, and a run
    resumed mid-epoch draws exactly what the uninterrupted run drew (a worker's own RNG is not in any checkpoint).
    ``set_epoch`` (Lightning calls it on ``loader.sampler``) reaches the wrapped sampler.
    """

    def __init__(self, sampler: Sampler[int], seed: int) -> None:
        self.sampler = sampler
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((index, sample_seed(self.seed, self.epoch, index)) for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


MASK_64 = (1 << 64) - 1


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 63-bit seed for one sample in one epoch: SplitMix64's mixer over the three numbers in turn.

    In plain integers: numpy's ``SeedSequence`` per sample cost a visible share of an image-folder step.
    """
    mixed = 0
    for number in (seed, epoch, index):
        mixed = splitmix64(mixed ^ (number & MASK_64))
    return mixed >> 1


def splitmix64(value: int) -> int:
    """SplitMix64's step and finaliser (Steele, Lea and Flood, 2014): a bijection of 64-bit integers."""
    value = (value + 0x9E3779B97F4A7C15) & MASK_64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK_64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK_64
    return value ^ (value >> 31)
