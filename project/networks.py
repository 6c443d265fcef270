"""Networks: plain ``torch.nn.Module`` classes, free of Lightning, picked from config by class path.

Each takes ``num_classes`` and ``input_shape`` first; the CLI links both from the data module,
so swapping the data set never means editing the network's config.
"""

from math import prod

from torch import Tensor, nn


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
