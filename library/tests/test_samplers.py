import collections
import itertools

import pytest
import torch
from torch.utils.data import DistributedSampler

from trainfleet.data.samplers import (
    ExactDistributedSampler,
    Remainder,
    ResumableDistributedSampler,
    sample_seed,
    split_rest,
)


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


def _resumable(size, world_size, rank, batch_size=64, drop_last=False, seed=42):
    return ResumableDistributedSampler(range(size), world_size, rank, True, seed, batch_size, drop_last)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_resumable_sampler_is_torchs_outside_a_resumed_epoch(world_size):
    for epoch in (0, 1):
        ours = []
        for rank in range(world_size):
            sampler = _resumable(1258, world_size, rank)
            sampler.resume_at(Remainder(epoch=5, start=640, seed=42))  # another epoch's: no effect here
            sampler.set_epoch(epoch)
            ours.append(list(sampler))
        assert ours == _train_shards(1258, world_size, epoch)


@pytest.mark.parametrize(("world_size", "steps"), [(1, 5), (2, 5), (3, 2)])
def test_what_the_ranks_trained_after_some_steps_is_a_prefix_of_the_epochs_order(world_size, steps):
    batch = 64
    shards = _train_shards(1258, world_size, epoch=3)
    trained = sorted(itertools.chain(*(shard[: steps * batch] for shard in shards)))
    sampler = _resumable(1258, world_size, 0, batch)
    count = sampler.trained(3, steps)
    assert count == steps * batch * world_size and trained == sorted(sampler.order(3)[:count])


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 2, 64])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("rest", [0, 1, 2, 3, 5, 128, 129, 130, 618, 937])
def test_the_rest_of_an_epoch_is_split_once_with_as_many_steps_on_every_rank(rest, world_size, batch_size, drop_last):
    order = list(range(1000, 1000 + rest))
    shares = [split_rest(order, world_size, rank, batch_size, drop_last) for rank in range(world_size)]
    samples = [share for share, _ in shares]
    padding = shares[0][1]
    steps = {(len(s) // batch_size if drop_last else -(-len(s) // batch_size)) for s in samples}
    assert len(steps) == 1  # DDP: every rank runs as many steps
    counts = collections.Counter(itertools.chain(*samples))
    if drop_last:
        assert padding == 0 and set(counts.values()) <= {1}
        assert rest - sum(counts.values()) < world_size * (batch_size + 1)  # less than a step's worth left out
    else:
        assert set(counts) == set(order) and sum(counts.values()) == rest + padding  # each once, bar the padding
        assert padding == 0 or (rest // world_size) % batch_size == 0  # repeats only where a rank would be short
        assert padding < world_size


def test_a_resumed_epoch_gives_each_rank_its_share_of_the_rest_and_its_steps():
    shares = []
    for rank in range(3):
        sampler = _resumable(1258, 3, rank)
        sampler.resume_at(Remainder(epoch=0, start=640, seed=42))
        sampler.set_epoch(0)
        shares.append(list(sampler))
        assert sampler.steps(0) == 4 and sampler.steps(1) == 7 and len(sampler) == 420  # its length: a fresh epoch's
        assert sampler.trained(0, 2) == 640 + 2 * 64 * 3
    assert sorted(itertools.chain(*shares)) == sorted(_resumable(1258, 1, 0).order(0)[640:])
