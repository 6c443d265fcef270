import itertools

import pytest
import torch
from torch.utils.data import DistributedSampler

from project.data.samplers import ExactDistributedSampler, sample_seed


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("size", [12, 359, 1, 0])
def test_exact_sampler_gives_every_index_to_exactly_one_rank(world_size, size):
    data = range(size)
    shards = [list(ExactDistributedSampler(data, world_size, rank)) for rank in range(world_size)]
    assert sorted(itertools.chain(*shards)) == list(range(size))
    assert [len(ExactDistributedSampler(data, world_size, rank)) for rank in range(world_size)] == list(
        map(len, shards)
    )
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_exact_sampler_rejects_a_rank_outside_the_world():
    with pytest.raises(ValueError, match="rank must be in"):
        ExactDistributedSampler(range(10), num_replicas=2, rank=2)


def _train_shards(size, world_size, epoch, seed=42):
    shards = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def test_train_sampler_shards_disjointly_and_reshuffles_per_epoch():
    size, world_size = 1258, 2  # digits' training split
    epoch0, epoch1 = _train_shards(size, world_size, 0), _train_shards(size, world_size, 1)
    for shards in (epoch0, epoch1):
        assert set(shards[0]).isdisjoint(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(size))
    assert epoch0 != epoch1
    assert epoch0 == _train_shards(size, world_size, 0)  # same seed and epoch, same order


def test_train_sampler_pads_so_every_rank_runs_the_same_number_of_steps():
    shards = _train_shards(size=1259, world_size=3, epoch=0)
    assert [len(s) for s in shards] == [420, 420, 420]
    assert set(itertools.chain(*shards)) == set(range(1259))
    assert torch.tensor(list(itertools.chain(*shards))).unique().numel() == 1259


def test_sample_seeds_are_distinct_63_bit_and_depend_only_on_seed_epoch_and_index():
    seeds = [sample_seed(seed, epoch, index) for seed in range(3) for epoch in range(5) for index in range(2000)]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**63 for s in seeds)
    assert sample_seed(1, 2, 3) == sample_seed(1, 2, 3) != sample_seed(1, 3, 2)
