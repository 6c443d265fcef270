"""The trainfleet library's reusable checks (``trainfleet.testing``) applied to this project's networks,
module and data: a new class of yours gets its own lines here (a subclass of the suite, its arguments)."""

import pytest
from trainfleet.testing import BaseDataModuleSuite, ModuleSuite, NetworkSuite

from project.data import DigitsDataModule
from project.module import ClassificationModule
from project.networks import MLP, SmallCNN, TorchvisionModel


class TestMLP(NetworkSuite):
    network_class = MLP
    init_args = {"hidden_sizes": (16, 8)}


class TestSmallCNN(NetworkSuite):
    network_class = SmallCNN
    init_args = {"channels": (4, 8)}


class TestSmallCNNOnColourImages(TestSmallCNN):
    input_shape = (3, 28, 28)


class TestTorchvisionModel(NetworkSuite):
    network_class = TorchvisionModel
    init_args = {"name": "resnet18"}
    input_shape = (3, 32, 32)

    @pytest.fixture(autouse=True)
    def needs_torchvision(self):
        pytest.importorskip("torchvision")


class TestDigits(BaseDataModuleSuite):
    data_module_class = DigitsDataModule
    init_args = {"batch_size": 128}


@pytest.mark.slow  # three short fits: about 5 s
class TestClassificationModule(ModuleSuite):
    def make_module(self):
        return ClassificationModule(MLP(10, (1, 8, 8), hidden_sizes=(16,), dropout=0.1), num_classes=10)

    def make_data_module(self, tmp_path_factory):
        return DigitsDataModule(batch_size=64)
