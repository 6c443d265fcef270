"""Any map-style ``torch.utils.data.Dataset`` of ``(image, label)`` pairs, given by class path in the config."""

from torch.utils.data import Dataset

from trainfleet.data.base import SPLITS, BaseDataModule


class DatasetDataModule(BaseDataModule):
    """Your own datasets, sharded, transformed and loaded like every data module here.

    Give ``train`` alone (split into train/val/test with ``split_seed``), or ``val`` and/or ``test`` as well (only
    the missing ones are split off ``train``)::

        data:
          class_path: trainfleet.data.DatasetDataModule
          init_args:
            train: {class_path: torchvision.datasets.CIFAR10, init_args: {root: data, train: true}}
            test: {class_path: torchvision.datasets.CIFAR10, init_args: {root: data, train: false}}
            eval_transforms: [{class_path: torchvision.transforms.v2.ToImage}, ...]

    Args:
        train, val, test: the datasets.
        num_classes: classes to predict; read from ``train.classes`` (torchvision's data sets have it) when not given.
        input_shape: one transformed sample's shape; read from the first training sample when not given.
        **kwargs: the ``BaseDataModule`` arguments (transforms, batch_size, num_workers, ...).
    """

    def __init__(
        self,
        train: Dataset,
        val: Dataset | None = None,
        test: Dataset | None = None,
        num_classes: int | None = None,
        input_shape: tuple[int, ...] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.given = {name: data for name, data in zip(SPLITS, (train, val, test), strict=True) if data is not None}
        self.discover(train, num_classes, input_shape)

    def datasets(self) -> dict[str, Dataset]:
        return self.given
