"""Samplers that shard a data set across ranks.

Training uses torch's ``DistributedSampler`` (shuffled, seeded, reshuffled by ``set_epoch``, padded so every rank
runs the same number of steps, which DDP needs), as ``ResumableDistributedSampler``: the same order, able to start an
epoch after the samples a run on another world size already trained. Evaluation uses ``ExactDistributedSampler``:
Lightning's injected sampler pads evaluation sets with duplicates, which makes distributed accuracy wrong whenever
``len(dataset) % world_size != 0``. ``SeededSampler`` gives each training sample the seed of its augmentation.
"""

from collections.abc import Iterator, Sized
from dataclasses import dataclass

import torch
from torch.utils.data import DistributedSampler, Sampler


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


@dataclass(frozen=True)
class Remainder:
    """Where a resumed epoch starts: the first ``start`` samples of its order are trained (any world size trained
    them: they are a prefix of the order, see ``ResumableDistributedSampler``)."""

    epoch: int
    start: int
    seed: int  # the seed of the checkpoint's run: the order is that run's


class ResumableDistributedSampler(DistributedSampler):
    """torch's ``DistributedSampler``, whose epoch can start after the samples already trained, on any world size.

    Hand-written because torch's sampler has no position, and torchdata's ``StatefulDistributedSampler`` keeps a
    position per rank (samples yielded), which another number of ranks cannot split. Here the position is global:
    ``DistributedSampler`` gives rank ``r`` the positions ``r, r + W, r + 2W, ...`` of the epoch's (padded) order, so
    after ``j`` steps of ``batch_size`` every rank has trained the first ``j * batch_size * W`` positions of that
    order, a prefix. A resumed epoch (``resume_at``) trains the rest of the order once, split the same way across the
    new ranks; other epochs are the fresh ``DistributedSampler``'s, bit for bit.

    Every rank must run the same number of steps (DDP): the rest goes unpadded unless a rank would be a step short
    (its share a multiple of the batch size while another rank has one sample more, or fewer samples than ranks
    left); then it is padded with its own first samples, as ``DistributedSampler`` pads (``padding``). With
    ``batch_drop_last`` (the loader's ``drop_last``) every rank trains whole batches only, the rest is not trained.
    ``__len__`` stays the fresh epoch's, which Lightning reads once as every epoch's length.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int,
        rank: int,
        shuffle: bool,
        seed: int,
        batch_size: int,
        batch_drop_last: bool = False,
    ) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size
        self.batch_drop_last = batch_drop_last
        self.remainder: Remainder | None = None

    def order(self, epoch: int, seed: int | None = None) -> list[int]:
        """The epoch's order before padding: ``DistributedSampler.__iter__``'s."""
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed((self.seed if seed is None else seed) + epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def resume_at(self, remainder: Remainder) -> None:
        self.remainder = remainder

    def resumed(self, epoch: int) -> Remainder | None:
        return self.remainder if self.remainder is not None and self.remainder.epoch == epoch else None

    def rest(self, epoch: int) -> tuple[list[int], int]:
        """The positions of a resumed epoch's order this rank trains, and how many of the rest are padding."""
        remainder = self.resumed(epoch)
        assert remainder is not None
        rest = self.order(epoch, remainder.seed)[remainder.start :]
        return split_rest(rest, self.num_replicas, self.rank, self.batch_size, self.batch_drop_last)

    def steps(self, epoch: int) -> int:
        """The steps every rank runs in EPOCH: the rest's in a resumed epoch, the fresh epoch's otherwise."""
        share = len(self.rest(epoch)[0]) if self.resumed(epoch) else len(self)
        return share // self.batch_size if self.batch_drop_last else -(-share // self.batch_size)

    def trained(self, epoch: int, steps: int) -> int:
        """How many samples of EPOCH's order every rank together has trained after STEPS steps of it (this run's
        steps: those after the resume in a resumed epoch)."""
        remainder = self.resumed(epoch)
        start = remainder.start if remainder else 0
        return start + min(steps * self.batch_size * self.num_replicas, len(self.dataset) - start)

    def __iter__(self) -> Iterator[int]:
        if self.resumed(self.epoch) is None:
            return super().__iter__()
        return iter(self.rest(self.epoch)[0])


def split_rest(rest: list[int], world_size: int, rank: int, batch_size: int, drop_last: bool) -> tuple[list[int], int]:
    """RANK's share of REST, as ``DistributedSampler`` splits an order (every ``world_size``-th sample), so that every
    rank runs the same number of steps; and how many samples were repeated (padding) to make it so."""
    if drop_last:  # whole batches only, as many on every rank
        steps = len(rest) // world_size // batch_size
        return rest[: steps * batch_size * world_size][rank::world_size], 0
    shortest, extra = divmod(len(rest), world_size)
    padding = 0
    if rest and extra and shortest % batch_size == 0:  # the ranks without the extra sample would be a step short
        padding = world_size - extra
        rest = rest + (rest * padding)[:padding]
    return rest[rank::world_size], padding


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
