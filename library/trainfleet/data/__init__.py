"""Data: one data source per file, and the samplers and loaders they share.

- ``base.BaseDataModule``: splits, per-split transforms, DDP samplers, the fast tensor path or a DataLoader
- ``datasets.DatasetDataModule``: any map-style ``Dataset`` from the config
- ``in_memory.InMemoryDataModule`` (a project's digits subclass it), ``mnist.MNISTDataModule``: tensors in memory
- ``table.TableDataModule``: a CSV or Parquet table, held in memory, features standardised
- ``image_folder.ImageFolderDataModule``: a folder of images, one folder per class (torchvision)
- ``streaming.StreamingDataModule``: LitData shards, local or in object storage, for data beyond one node

Optional dependencies (torchvision, litdata, pyarrow) are imported only by the modules that use them.
"""

from trainfleet.data.base import BaseDataModule
from trainfleet.data.datasets import DatasetDataModule
from trainfleet.data.image_folder import ImageFolderDataModule
from trainfleet.data.in_memory import InMemoryDataModule
from trainfleet.data.mnist import MNISTDataModule
from trainfleet.data.streaming import StreamingDataModule
from trainfleet.data.table import TableDataModule

__all__ = [
    "BaseDataModule",
    "DatasetDataModule",
    "ImageFolderDataModule",
    "InMemoryDataModule",
    "MNISTDataModule",
    "StreamingDataModule",
    "TableDataModule",
]
