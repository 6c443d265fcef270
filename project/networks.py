"""Networks: plain ``torch.nn.Module`` classes, free of Lightning, picked from config by class path.

Each takes ``num_classes`` and ``input_shape`` first; the CLI links both from the data module,
so swapping the data set never means editing the network's config.
"""

from difflib import get_close_matches
from math import prod
from typing import Any

from torch import Tensor, nn


def check_widths(name: str, widths: tuple[int, ...]) -> None:
    """Layer widths of at least 1: torch builds a layer of width 0 (and the network learns nothing through it), and
    fails on a negative one with a RuntimeError the CLI does not read as bad input."""
    if any(width < 1 for width in widths):
        raise ValueError(f"{name} must each be >= 1, got {list(widths)}")


class MLP(nn.Module):
    """A multilayer perceptron over the flattened input."""

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        hidden_sizes: tuple[int, ...] = (128, 64),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_widths("hidden_sizes", hidden_sizes)
        layers: list[nn.Module] = [nn.Flatten()]
        width = prod(input_shape)
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks and a linear head; global average pooling makes it size-agnostic."""

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        channels: tuple[int, int] = (32, 64),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_widths("channels", channels)
        in_channels = input_shape[0]
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=3, padding=1),
            nn.BatchNorm2d(c1),
            nn.ReLU(),
            nn.Conv2d(c1, c2, kernel_size=3, padding=1),
            nn.BatchNorm2d(c2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(c2, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class TorchvisionModel(nn.Module):
    """Any torchvision classification model by name (``resnet18``, ``efficientnet_b0``, ...: the names
    ``torchvision.models.list_models(module=torchvision.models)`` gives), with ``num_classes`` outputs and random
    weights (nothing is downloaded). A class, unlike ``torchvision.models.resnet18``, a function jsonargparse cannot
    link ``num_classes`` into.

    Args:
        name: the model's name in ``torchvision.models``.
        options: the model's own keyword arguments, e.g. ``{dropout: 0.2}`` or ``{image_size: 32}`` for ViTs.
    """

    def __init__(
        self, num_classes: int, input_shape: tuple[int, ...], name: str, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        from torchvision import models  # the `vision` extra, needed only here

        names = models.list_models(module=models)
        if name not in names:
            close = get_close_matches(name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{name!r} is not a torchvision classification model{hint}")
        if input_shape[0] != 3:
            raise ValueError(
                f"torchvision's {name} takes 3-channel images, the data gives {input_shape[0]}: "
                "set data.init_args.grayscale false"
            )
        self.model = models.get_model(name, weights=None, num_classes=num_classes, **(options or {}))

    def forward(self, x: Tensor) -> Tensor:
        output = self.model(x)
        return getattr(output, "logits", output)  # GoogLeNet and Inception add auxiliary logits in training
