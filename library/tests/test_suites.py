"""The reusable suites (trainfleet/testing.py) beyond what a project applies to its own classes (its tests/): the
library's data modules, a plain LightningDataModule, and proof that the checks fail on code known to be wrong."""

import pytest
import torch
from lightning.pytorch import LightningDataModule
from project.data import DigitsDataModule
from project.module import ClassificationModule
from project.networks import MLP
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from trainfleet.data import TableDataModule
from trainfleet.testing import BaseDataModuleSuite, DataModuleSuite, ModuleSuite, NetworkSuite


class DigitsSuite(BaseDataModuleSuite):  # not collected here: the project's tests run it
    data_module_class = DigitsDataModule
    init_args = {"batch_size": 128}


class ClassifierSuite(ModuleSuite):  # not collected here: the project's tests run it
    def make_module(self):
        return ClassificationModule(MLP(10, (1, 8, 8), hidden_sizes=(16,), dropout=0.1), num_classes=10)

    def make_data_module(self, tmp_path_factory):
        return DigitsDataModule(batch_size=64)


class TestTable(BaseDataModuleSuite):
    data_module_class = TableDataModule

    def make_data_module(self, tmp_path_factory, **overrides):
        path = tmp_path_factory.mktemp("table") / "rows.csv"
        values = torch.randn(30, 2, generator=torch.Generator().manual_seed(0))
        path.write_text("a,b,label\n" + "".join(f"{a:.6f},{b:.6f},{row % 3}\n" for row, (a, b) in enumerate(values)))
        return TableDataModule(str(path), label="label", batch_size=4, **overrides)


class TestImageFolder(BaseDataModuleSuite):
    def make_data_module(self, tmp_path_factory, **overrides):
        image = pytest.importorskip("PIL.Image")
        from trainfleet.data import ImageFolderDataModule

        root = tmp_path_factory.mktemp("images")
        pixels = torch.randint(0, 256, (15, 6, 6), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
        for index, values in enumerate(pixels):  # 3 classes of 5 distinct grey images
            folder = root / f"class_{index % 3}"
            folder.mkdir(exist_ok=True)
            image.fromarray(values.numpy(), mode="L").save(folder / f"{index}.png")
        return ImageFolderDataModule(str(root), grayscale=True, batch_size=4, **overrides)


class RandomVectors(LightningDataModule):
    """A plain LightningDataModule, nothing of the template's base: 96 random vectors in 3 classes, split 64/16/16."""

    def __init__(self) -> None:
        super().__init__()
        inputs = torch.randn(96, 4, generator=torch.Generator().manual_seed(0))
        self.data = TensorDataset(inputs, torch.arange(96) % 3)

    def loader(self, start: int, stop: int, shuffle: bool = False) -> DataLoader:
        return DataLoader(Subset(self.data, range(start, stop)), batch_size=8, shuffle=shuffle)

    def train_dataloader(self) -> DataLoader:
        return self.loader(0, 64, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(64, 80)

    def test_dataloader(self) -> DataLoader:
        return self.loader(80, 96)


class TestAPlainLightningDataModule(DataModuleSuite):
    data_module_class = RandomVectors


class Halves(nn.Module):
    """Wrong on purpose: a batch-statistics layer in eval mode makes each output depend on the rest of its batch."""

    def __init__(self, num_classes: int, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.linear = nn.Linear(input_shape[-1], num_classes)
        self.unused = nn.Linear(1, 1)

    def forward(self, x):
        logits = self.linear(x.flatten(1)[:, -self.linear.in_features :])
        return logits - logits.mean(dim=0)


def test_the_network_suite_fails_a_network_that_is_wrong_naming_what(monkeypatch):
    class Check(NetworkSuite):
        network_class = Halves
        input_shape = (8,)

    suite, network = Check(), Halves(Check.num_classes, Check.input_shape)
    inputs = torch.randn(Check.batch_size, 8)
    with pytest.raises(AssertionError, match=r"no gradient reaches \['unused.weight', 'unused.bias'\]"):
        suite.test_gradients_reach_every_parameter(network, inputs)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        suite.test_an_eval_forward_is_deterministic_and_each_output_depends_on_its_own_input_only(network, inputs)


def test_the_data_suite_fails_an_eval_loader_that_pads_a_rank_with_a_duplicate(tmp_path_factory, monkeypatch):
    """Lightning's own DistributedSampler pads the shards to equal length (pitfall 5): the suite sees the duplicate."""
    from torch.utils.data import DistributedSampler

    import trainfleet.data.base

    suite = DigitsSuite()
    data = suite.ready(tmp_path_factory)
    assert len(data.splits["test"]) == 359  # odd: 2 ranks get 180 each, one sample twice
    padding = lambda *args: DistributedSampler(*args, shuffle=False)  # noqa: E731
    monkeypatch.setattr(trainfleet.data.base, "ExactDistributedSampler", padding)
    with pytest.raises(AssertionError, match="test on 2 ranks"):
        suite.test_the_eval_loaders_give_every_sample_once_across_ranks(data, 2)


@pytest.mark.slow  # three short fits
def test_the_module_suite_fails_a_resume_that_loses_the_rng_states(tmp_path, tmp_path_factory):
    """Without ResumeState, dropout draws other numbers after the resume: the suite sees other weights."""

    class WithoutResumeState(ClassifierSuite):
        def trainer(self, root, **overrides):
            return super().trainer(root, callbacks=[], **overrides)

    with pytest.raises(AssertionError):
        WithoutResumeState().test_a_fit_resumed_from_its_checkpoint_ends_with_the_uninterrupted_fits_weights(
            tmp_path, tmp_path_factory
        )
