"""Reusable checks for your own network and data module: subclass a suite, set its class and arguments, and pytest
runs every check on it (tests/test_suites.py applies them to the template's own networks and data modules).

    from suites import NetworkSuite
    from project.networks import MyNet

    class TestMyNet(NetworkSuite):
        network_class = MyNet
        init_args = {"width": 32}

In-process and on tiny inputs: a suite runs in about a second. The data checks compare samples by content
(``sample_key``), so they expect the data set to hold no two identical samples.
"""

from collections import Counter
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from project.data.base import SPLITS, BaseDataModule
from project.data.transforms import Transformed


class NetworkSuite:
    """Checks a network class: ``network_class(num_classes, input_shape, **init_args)``."""

    network_class: ClassVar[type[nn.Module]]
    init_args: ClassVar[dict[str, Any]] = {}
    num_classes: ClassVar[int] = 5
    input_shape: ClassVar[tuple[int, ...]] = (1, 8, 8)
    batch_size: ClassVar[int] = 4

    @pytest.fixture
    def network(self) -> nn.Module:
        torch.manual_seed(0)
        return self.network_class(self.num_classes, self.input_shape, **self.init_args)

    @pytest.fixture
    def inputs(self) -> Tensor:
        return torch.randn(self.batch_size, *self.input_shape, generator=torch.Generator().manual_seed(1))

    @pytest.mark.parametrize("mode", ["train", "eval"])
    def test_output_is_one_logit_per_class_for_each_input(self, network, inputs, mode):
        network.train(mode == "train")
        logits = network(inputs)
        assert isinstance(logits, Tensor), f"the network returns {type(logits).__name__}, not a tensor of logits"
        assert logits.shape == (self.batch_size, self.num_classes) and logits.is_floating_point()

    def test_gradients_reach_every_parameter(self, network, inputs):
        labels = torch.arange(self.batch_size) % self.num_classes
        nn.functional.cross_entropy(network(inputs), labels).backward()
        params = network.named_parameters()
        missed = [name for name, p in params if p.requires_grad and (p.grad is None or not p.grad.any())]
        assert missed == [], f"no gradient reaches {missed}"

    def test_an_eval_forward_is_deterministic_and_each_output_depends_on_its_own_input_only(self, network, inputs):
        network.eval()
        with torch.no_grad():
            logits = network(inputs)
            assert torch.equal(network(inputs), logits)
            alone = torch.cat([network(sample[None]) for sample in inputs])  # what another batching would give
        torch.testing.assert_close(alone, logits, rtol=1e-4, atol=1e-5)


def sample_key(sample: tuple[Any, Any]) -> tuple[bytes, tuple[int, ...], int]:
    """A sample's identity by content: its input's bytes and shape (a tensor, or a PIL image) and its label."""
    x, y = sample
    array = x.detach().cpu().numpy() if isinstance(x, Tensor) else numpy.asarray(x)
    return array.tobytes(), array.shape, int(y)


def keys(samples: Iterable[tuple[Any, Any]]) -> Counter:
    return Counter(sample_key(sample) for sample in samples)


def samples(dataset: Dataset) -> Iterable[tuple[Any, Any]]:
    return (dataset[index] for index in range(len(dataset)))


def batch_keys(batches: Iterable[list[Tensor]]) -> Counter:
    return keys(sample for x, y in batches for sample in zip(x, y, strict=True))


def untransformed(dataset: Dataset) -> Dataset:
    return dataset.dataset if isinstance(dataset, Transformed) else dataset


class DataModuleSuite:
    """Checks a data module: ``make_data_module`` (by default ``data_module_class(**init_args)``), set up for fit."""

    data_module_class: ClassVar[type[BaseDataModule]]
    init_args: ClassVar[dict[str, Any]] = {}

    def make_data_module(self, tmp_path_factory: pytest.TempPathFactory, **overrides: Any) -> BaseDataModule:
        """Override for a module that needs files (write tiny ones under ``tmp_path_factory.mktemp(...)``)."""
        return self.data_module_class(**{**self.init_args, **overrides})

    def ready(self, tmp_path_factory: pytest.TempPathFactory, **overrides: Any) -> BaseDataModule:
        data = self.make_data_module(tmp_path_factory, **overrides)
        data.setup("fit")
        return data

    @pytest.fixture
    def data(self, tmp_path_factory) -> BaseDataModule:
        return self.ready(tmp_path_factory)

    def test_the_splits_are_disjoint_and_cover_the_data(self, data):
        source = keys(sample for dataset in data.datasets().values() for sample in samples(dataset))
        splits = {name: keys(samples(untransformed(data.splits[name]))) for name in SPLITS}
        assert all(splits.values()), f"an empty split: { {name: len(split) for name, split in splits.items()} }"
        for index, first in enumerate(SPLITS):
            for second in SPLITS[index + 1 :]:
                shared = splits[first].keys() & splits[second].keys()
                assert not shared, f"{len(shared)} samples in both {first} and {second}"
        assert sum(splits.values(), Counter()) == source  # every sample of the data in one split, once

    @pytest.mark.parametrize("world_size", [1, 2, 3])
    def test_the_eval_loaders_give_every_sample_once_across_ranks(self, data, world_size):
        for name, loader in (("val", data.val_dataloader), ("test", data.test_dataloader)):
            seen = Counter()
            for rank in range(world_size):
                data.trainer = SimpleNamespace(  # what the loaders read of a Trainer: ranks and device
                    world_size=world_size, global_rank=rank, strategy=SimpleNamespace(root_device=torch.device("cpu"))
                )
                seen += batch_keys(loader())
            data.trainer = None
            assert seen == keys(samples(data.splits[name])), f"{name} on {world_size} ranks"

    def test_batches_are_input_shape_inputs_with_labels_below_num_classes(self, data):
        for x, y in data.train_dataloader():
            assert x.shape[1:] == data.input_shape and x.is_floating_point()
            assert 0 < len(x) == len(y) <= data.hparams.batch_size
            assert y.dtype == torch.long and y.min() >= 0 and y.max() < data.num_classes

    def test_the_training_order_is_seeded_and_changes_every_epoch(self, data, tmp_path_factory):
        def order(module: BaseDataModule, epoch: int = 0) -> list[tuple]:
            loader = module.train_dataloader()
            loader.sampler.set_epoch(epoch)  # what Lightning calls at every epoch's start
            return [sample_key(sample) for x, y in loader for sample in zip(x, y, strict=True)]

        first = order(data)
        assert first == order(self.ready(tmp_path_factory)), "the same seed gave another order"
        assert first != order(self.ready(tmp_path_factory, seed=data.hparams.seed + 1)), "another seed, the same order"
        next_epoch = order(data, epoch=1)
        assert first != next_epoch, "the same order every epoch"
        if not data.augmented:  # augmented samples differ from epoch to epoch: then only the order is compared
            assert Counter(first) == Counter(next_epoch)
