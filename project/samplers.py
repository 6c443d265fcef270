"""Samplers that shard a data set across ranks.

Training uses torch's ``DistributedSampler`` as it is (shuffled, seeded, reshuffled by ``set_epoch``,
padded so every rank runs the same number of steps, which DDP needs). Evaluation uses
``ExactDistributedSampler``: Lightning's injected sampler pads evaluation sets with duplicates,
which makes distributed accuracy wrong whenever ``len(dataset) % world_size != 0``.
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
