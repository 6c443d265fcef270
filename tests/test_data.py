import torch

from project.data import DigitsDataModule


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
