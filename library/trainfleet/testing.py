"""Reusable checks for your own network, LightningModule and data module: subclass a suite, set its class and
arguments, and pytest runs every check on it (a project's tests/ apply them to its own).

    from trainfleet.testing import NetworkSuite
    from project.networks import MyNet

    class TestMyNet(NetworkSuite):
        network_class = MyNet
        init_args = {"width": 32}

- ``NetworkSuite``: any network taking ``num_classes`` and ``input_shape`` first;
- ``ModuleSuite``: any ``LightningModule`` with a data module to feed it: a step of each stage, its state dict, and a
  short fit resumed from its checkpoint that ends with the uninterrupted fit's weights;
- ``DataModuleSuite``: any ``LightningDataModule`` giving ``(inputs, labels)`` batches; ``BaseDataModuleSuite`` adds
  what a data module on ``BaseDataModule`` promises (splits that cover the data, every eval sample once across ranks,
  a seeded training order).

In-process and on tiny inputs: a suite runs in seconds. The data checks compare samples by content (``sample_key``),
so they expect the data set to hold no two identical samples.
"""

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy
import pytest
import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import Dataset

from trainfleet.checkpoints.resume_state import ResumeState
from trainfleet.data.base import SPLITS, BaseDataModule
from trainfleet.data.transforms import Transformed
from trainfleet.runtime.known_noise import silence_known_noise

silence_known_noise()  # the third-party warnings every command of a project silences: a suite's runs see the same


def differing_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    """The names one state dict lacks, then those whose tensors are not bit-identical."""
    missing = sorted(actual.keys() ^ expected.keys())
    return missing + [name for name in expected if name in actual and not torch.equal(actual[name], expected[name])]


def assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Bit-identical state dicts: the same names, every tensor equal (the assertion names those that differ)."""
    assert differing_weights(actual, expected) == []


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


class ModuleSuite:
    """Checks a LightningModule on CPU, one process: ``make_module()`` fed by ``make_data_module(tmp_path_factory)``.

    The Trainer is Lightning's, with what the template's CLI adds for an exact resume (``ResumeState``: RNG states in
    the checkpoint); no logger, progress bar or checkpoint callback. A module built in Python keeps its arguments
    (a network object) in its hyperparameters: the suite reads back its own checkpoint with ``weights_only=False``."""

    def make_module(self) -> LightningModule:
        raise NotImplementedError("a ModuleSuite subclass returns its module from make_module()")

    def make_data_module(self, tmp_path_factory: pytest.TempPathFactory) -> LightningDataModule:
        raise NotImplementedError(
            "a ModuleSuite subclass returns the data module that feeds it from make_data_module()"
        )

    resume_after_steps: ClassVar[int] = 3  # the fit stops here, in its first epoch, and resumes to twice as many

    def trainer(self, root: Path, **overrides: Any) -> Trainer:
        settings = dict(
            accelerator="cpu",
            devices=1,
            default_root_dir=root,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=2,
            limit_test_batches=2,
            limit_predict_batches=2,
            val_check_interval=None,
            callbacks=[ResumeState()],
        )
        return Trainer(**{**settings, **overrides})

    def fit(self, root: Path, tmp_path_factory: pytest.TempPathFactory, steps: int, **fit_args: Any) -> Trainer:
        """A seeded fit of STEPS optimizer steps (a resume included), from a fresh module and data module, that
        saves a checkpoint at its last step as a run would (during the step, not after the fit)."""
        seed_everything(0, workers=True)
        module, data = self.make_module(), self.make_data_module(tmp_path_factory)
        saves = ModelCheckpoint(root, "{step}", every_n_train_steps=steps, save_top_k=-1)
        trainer = self.trainer(root, max_steps=steps, limit_val_batches=0, enable_checkpointing=True)
        trainer.callbacks.append(saves)
        trainer.fit(module, datamodule=data, **fit_args)
        return trainer

    def test_a_step_of_each_stage_runs_and_training_changes_the_weights(self, tmp_path, tmp_path_factory):
        seed_everything(0)
        module, data = self.make_module(), self.make_data_module(tmp_path_factory)
        trainer = self.trainer(tmp_path, max_steps=1, limit_val_batches=1)
        data.setup("fit")  # LazyLinear and the like: the weights exist after a first forward, or configure_model
        trainer.strategy.connect(module)
        before = {name: value.detach().clone() for name, value in module.state_dict().items()}
        trainer.fit(module, datamodule=data)
        changed = [name for name, value in module.state_dict().items() if not torch.equal(value, before.get(name))]
        assert changed, "a training step changed no weight"
        for stage in ("validate", "test"):
            [metrics] = getattr(trainer, stage)(module, datamodule=data, verbose=False)
            assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values()), f"{stage}: {metrics}"
        if type(module).predict_step is not LightningModule.predict_step and hasattr(data, "predict_dataloader"):
            predictions = trainer.predict(module, datamodule=data)
            assert predictions, "predict gave nothing"

    def test_the_state_dict_loads_into_a_new_module_that_then_computes_the_same(self, tmp_path_factory):
        seed_everything(0)
        module, data = self.make_module(), self.make_data_module(tmp_path_factory)
        data.setup("fit")
        batch = next(iter(data.train_dataloader()))
        seed_everything(1)  # another initialisation: the copy must not match by chance
        copy = self.make_module()
        module.eval(), copy.eval()
        with torch.no_grad():
            module(batch[0]), copy(batch[0])  # lazily built layers exist after a forward
            copy.load_state_dict(module.state_dict())
            assert_same_weights(copy.state_dict(), module.state_dict())
            torch.testing.assert_close(copy(batch[0]), module(batch[0]), rtol=0, atol=0)

    def test_a_fit_resumed_from_its_checkpoint_ends_with_the_uninterrupted_fits_weights(
        self, tmp_path, tmp_path_factory
    ):
        steps = self.resume_after_steps
        uninterrupted = self.fit(tmp_path / "whole", tmp_path_factory, 2 * steps).lightning_module.state_dict()
        self.fit(tmp_path / "first", tmp_path_factory, steps)
        checkpoint = tmp_path / "first" / f"step={steps}.ckpt"
        resumed = self.fit(tmp_path / "second", tmp_path_factory, 2 * steps, ckpt_path=checkpoint, weights_only=False)
        assert resumed.global_step == 2 * steps
        assert_same_weights(resumed.lightning_module.state_dict(), uninterrupted)


class DataModuleSuite:
    """Checks any LightningDataModule through its loaders: ``make_data_module`` (by default
    ``data_module_class(**init_args)``), set up for fit. ``augmented``: its training samples change from epoch to
    epoch (random augmentation), so they are not compared with the evaluation ones."""

    data_module_class: ClassVar[type[LightningDataModule]]
    init_args: ClassVar[dict[str, Any]] = {}
    augmented: ClassVar[bool] = False

    def make_data_module(self, tmp_path_factory: pytest.TempPathFactory, **overrides: Any) -> LightningDataModule:
        """Override for a module that needs files (write tiny ones under ``tmp_path_factory.mktemp(...)``)."""
        return self.data_module_class(**{**self.init_args, **overrides})

    def ready(self, tmp_path_factory: pytest.TempPathFactory, **overrides: Any) -> LightningDataModule:
        data = self.make_data_module(tmp_path_factory, **overrides)
        data.setup("fit")
        return data

    @pytest.fixture
    def data(self, tmp_path_factory) -> LightningDataModule:
        return self.ready(tmp_path_factory)

    def loader_keys(self, data: LightningDataModule) -> dict[str, Counter]:
        """The samples each loader gives, by content (one rank: no Trainer attached)."""
        loaders = {"train": data.train_dataloader, "val": data.val_dataloader, "test": data.test_dataloader}
        return {name: batch_keys(loader()) for name, loader in loaders.items()}

    def test_every_loader_gives_float_inputs_of_one_shape_with_integer_labels(self, data):
        for name, loader in (("train", data.train_dataloader), ("val", data.val_dataloader)):
            shapes = set()
            for x, y in loader():
                assert x.is_floating_point() and len(x) == len(y) > 0, name
                assert not y.is_floating_point() and y.min() >= 0, f"{name}: labels must be class indices"
                shapes.add(tuple(x.shape[1:]))
            assert len(shapes) == 1, f"{name}: inputs of several shapes {shapes}"

    def test_no_sample_is_in_two_splits(self, data):
        found = self.loader_keys(data)
        augmented = getattr(data, "augmented", self.augmented)  # BaseDataModule knows its own
        pairs = [("val", "test")] + ([] if augmented else [("train", "val"), ("train", "test")])
        for first, second in pairs:
            shared = found[first].keys() & found[second].keys()
            assert not shared, f"{len(shared)} samples in both {first} and {second}"

    def test_the_eval_loaders_give_the_same_samples_in_the_same_order_every_time(self, data):
        for loader in (data.val_dataloader, data.test_dataloader):
            first, again = [[sample_key(s) for x, y in loader() for s in zip(x, y, strict=True)] for _ in range(2)]
            assert first == again


class BaseDataModuleSuite(DataModuleSuite):
    """What a data module on ``BaseDataModule`` promises beside: splits that cover its data, every eval sample once
    across any number of ranks, batches of its ``input_shape`` and ``num_classes``, a seeded training order."""

    data_module_class: ClassVar[type[BaseDataModule]]

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
