import pytest
import torch
from project.data import DigitsDataModule
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from trainfleet.data import DatasetDataModule


def _setup(**kwargs) -> DigitsDataModule:
    data = DigitsDataModule(**kwargs)
    data.setup("fit")
    return data


def test_digits_split_sizes_cover_the_data_set_once():
    data = _setup()
    sizes = {name: len(split) for name, split in data.splits.items()}
    assert sizes == {"train": 1258, "val": 180, "test": 359}
    assert data.num_classes == 10 and data.input_shape == (1, 8, 8)
    images = torch.cat([split.tensors[0] for split in data.splits.values()])
    assert images.shape == (1797, 1, 8, 8)
    assert images.min() >= 0.0 and images.max() <= 1.0


def test_digits_split_is_deterministic_and_follows_split_seed():
    first, again, other = _setup(), _setup(), _setup(split_seed=1)
    for name in ("train", "val", "test"):
        assert torch.equal(first.splits[name].tensors[0], again.splits[name].tensors[0])
    assert not torch.equal(first.splits["test"].tensors[1], other.splits["test"].tensors[1])


def test_loaders_cover_each_split_with_the_configured_batch_size():
    data = _setup(batch_size=100)
    test_batches = list(data.test_dataloader())
    assert [len(y) for _, y in test_batches] == [100, 100, 100, 59]
    assert sum(len(y) for _, y in data.train_dataloader()) == 1258


def test_any_dataset_splits_off_only_the_missing_splits_and_keeps_the_given_ones():
    train = TensorDataset(torch.rand(100, 1, 4, 4), torch.arange(100) % 5)
    test = TensorDataset(torch.rand(30, 1, 4, 4), torch.arange(30) % 5)
    data = DatasetDataModule(train, test=test, num_classes=5, val_fraction=0.2, batch_size=8)
    data.setup("fit")
    assert {name: len(split) for name, split in data.splits.items()} == {"train": 80, "val": 20, "test": 30}
    assert data.splits["test"] is test and data.input_shape == (1, 4, 4)
    assert torch.equal(
        torch.cat([data.splits[name].tensors[1] for name in ("train", "val")]).sort().values,
        train.tensors[1].sort().values,
    )  # train and val partition the given train set
    with pytest.raises(ValueError, match="give data.init_args.num_classes: TensorDataset has no `classes`"):
        DatasetDataModule(train)


@pytest.mark.slow
def test_the_dataloader_path_yields_the_fast_paths_batches():
    fast, loader = _setup(batch_size=100), _setup(batch_size=100, in_memory=False, num_workers=1)
    assert isinstance(loader.test_dataloader(), StatefulDataLoader)
    assert loader.train_dataloader().snapshot_every_n_steps == 64  # workers report their position every 64 batches
    for a, b in zip(fast.train_dataloader(), loader.train_dataloader(), strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"prefetch_factor": 2}, "prefetch_factor must be >= 1 and needs num_workers > 0; got 2"),
        ({"snapshot_every_n_steps": 0}, "snapshot_every_n_steps must be >= 1, got 0"),
    ],
)
def test_loader_options_out_of_range_are_refused(option, message):
    with pytest.raises(ValueError, match=message):
        DigitsDataModule(**option)
