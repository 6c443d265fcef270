"""What the template's networks do beside what every network must (tests/test_suites.py runs NetworkSuite on them)."""

import pytest
import torch
from project.networks import MLP


def test_mlp_hidden_sizes_define_the_layers():
    network = MLP(num_classes=10, input_shape=(1, 8, 8), hidden_sizes=(32, 16, 8))
    widths = [(m.in_features, m.out_features) for m in network.modules() if isinstance(m, torch.nn.Linear)]
    assert widths == [(64, 32), (32, 16), (16, 8), (8, 10)]


def test_a_torchvision_model_by_name_has_the_datas_classes_and_plain_logits():
    pytest.importorskip("torchvision")
    from project.networks import TorchvisionModel

    network = TorchvisionModel(num_classes=7, input_shape=(3, 32, 32), name="googlenet", options={"init_weights": True})
    assert network(torch.randn(2, 3, 32, 32)).shape == (2, 7)  # in training too: not GoogLeNet's auxiliary tuple
    with pytest.raises(ValueError, match="'resnet81' is not a torchvision classification model; did you mean resnet18"):
        TorchvisionModel(num_classes=7, input_shape=(3, 32, 32), name="resnet81")
