"""Data: one data source per file, and the samplers and loaders they share.

- ``base.BaseDataModule``: splits, per-split transforms, DDP samplers, the fast tensor path or a DataLoader
- ``datasets.DatasetDataModule``: any map-style ``Dataset`` from the config
- ``in_memory.InMemoryDataModule``, ``digits.DigitsDataModule``, ``mnist.MNISTDataModule``: tensors in memory
- ``table.TableDataModule``: a CSV or Parquet table, held in memory, features standardised
- ``image_folder.ImageFolderDataModule``: a folder of images, one folder per class (torchvision)
- ``streaming.StreamingDataModule``: LitData shards, local or in object storage, for data beyond one node

Optional dependencies (torchvision, litdata, pyarrow) are imported only by the modules that use them.
"""

from project.data.base import BaseDataModule
from project.data.datasets import DatasetDataModule
from project.data.digits import DigitsDataModule
from project.data.image_folder import ImageFolderDataModule
from project.data.in_memory import InMemoryDataModule
from project.data.mnist import MNISTDataModule
from project.data.streaming import StreamingDataModule
from project.data.table import TableDataModule

__all__ = [
    "BaseDataModule",
    "DatasetDataModule",
    "DigitsDataModule",
    "ImageFolderDataModule",
    "InMemoryDataModule",
    "MNISTDataModule",
    "StreamingDataModule",
    "TableDataModule",
]
