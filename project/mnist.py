"""Where ``MNISTDataModule`` lived before ``project/data/``: configs saved with this class path still run."""

from project.data.mnist import MNISTDataModule

__all__ = ["MNISTDataModule"]
