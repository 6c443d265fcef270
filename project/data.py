"""scikit-learn's bundled handwritten digits: the default data set, no download."""

import torch
from torch import Tensor
from trainfleet.data import InMemoryDataModule


class DigitsDataModule(InMemoryDataModule):
    """scikit-learn's bundled 8x8 handwritten digits: 1,797 real images, no download."""

    num_classes = 10
    input_shape = (1, 8, 8)

    def load(self) -> tuple[Tensor, Tensor]:
        from sklearn.datasets import load_digits  # imported here: scikit-learn is slow to import

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        return images, torch.tensor(digits.target, dtype=torch.long)
