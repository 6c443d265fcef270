"""A table (CSV, or Parquet with the ``table`` extra): one row per sample, numeric feature columns, a label column.

Held in memory as two tensors (the fast path: batches sliced out of them, exact resume and evaluation), features
standardised with the training split's mean and standard deviation only, so nothing of val/test leaks into training.
"""

import csv
import math
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from project.data.base import split
from project.data.in_memory import InMemoryDataModule

Columns = dict[str, list]  # column name: its values, row by row


class TableDataModule(InMemoryDataModule):
    """Classifies the rows of a CSV or Parquet file by one of its columns.

    The file is read when the module is built, so a bad file stops the run (exit 2) before any process starts: a
    missing column, or a missing or non-numeric feature value, named with the file, the row (1 for the first data row;
    the CSV line is one more, for the header) and the column. Labels may be of any type (numbers, strings, booleans):
    class ``i`` is the ``i``-th label in sorted order (numerically when every label is a number), so the same labels
    give the same indices in every run; their names are in ``classes`` and in the predictions file.

    Args:
        path: the ``.csv`` (comma-separated, a header row) or ``.parquet`` file.
        label: the column to predict.
        features: the input columns, in order (``None``: every column but ``label``).
        **kwargs: the ``BaseDataModule`` arguments (batch_size, val_fraction, test_fraction, split_seed, predict_path,
            ...). ``predict_path``: a table with the same feature columns (its label column, if any, is not read).
    """

    def __init__(self, path: str, label: str, features: list[str] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        table = read_table(Path(path))
        self.features = features if features is not None else [name for name in table if name != label]
        check_columns(Path(path), table, [label, *self.features])
        self.classes, self.labels = class_indices(Path(path), label, table[label])
        self.values = feature_matrix(Path(path), table, self.features)
        self.num_classes = len(self.classes)
        self.input_shape = (len(self.features),)
        self.new_inputs = None
        if self.hparams.predict_path is not None:  # read now: a bad file is refused before anything runs
            inputs = read_table(Path(self.hparams.predict_path))
            check_columns(Path(self.hparams.predict_path), inputs, self.features)
            self.new_inputs = feature_matrix(Path(self.hparams.predict_path), inputs, self.features)
        self.mean = self.std = None

    def load(self) -> tuple[Tensor, Tensor]:
        return self.values, self.labels

    def datasets(self) -> dict[str, Dataset]:
        """The splits, standardised with the training split's statistics (a constant column becomes 0)."""
        fractions = {"test": self.hparams.test_fraction, "val": self.hparams.val_fraction}
        parts = split(TensorDataset(*self.load()), fractions, self.hparams.split_seed)
        train = parts["train"].tensors[0]
        self.mean, self.std = train.mean(dim=0), train.std(dim=0, correction=0)
        self.std[self.std == 0] = 1.0
        return {name: TensorDataset(self.standardise(part.tensors[0]), part.tensors[1]) for name, part in parts.items()}

    def standardise(self, values: Tensor) -> Tensor:
        return (values - self.mean) / self.std

    def read_inputs(self, path: Path) -> tuple[Dataset, list[str]]:
        """``predict_path``'s rows, standardised like the training data, named by their row number."""
        values = self.standardise(self.new_inputs)
        rows = [str(row) for row in range(1, len(values) + 1)]
        return TensorDataset(values, torch.zeros(len(values), dtype=torch.long)), rows


def read_table(path: Path) -> Columns:
    """The file's columns; CSV values as the strings written (an empty cell is ``None``), Parquet values as typed."""
    if not path.is_file():
        raise ValueError(f"table not found: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as parquet
        except ImportError as error:
            raise ValueError(
                f"reading {path} needs pyarrow: pip install -e '.[table]' (or give a .csv file)"
            ) from error
        return parquet.read_table(path).to_pydict()
    if path.suffix != ".csv":
        raise ValueError(f"{path}: give a .csv or .parquet file")
    with path.open(newline="") as file:
        reader = csv.reader(file)
        header = next(reader, None)
        if not header:
            raise ValueError(f"{path} is empty: it needs a header row and data rows")
        columns: Columns = {name: [] for name in header}
        for line, row in enumerate(reader, start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}: line {line} has {len(row)} values, the header {len(header)}")
            for name, value in zip(header, row, strict=True):
                columns[name].append(value if value.strip() else None)
    return columns


def check_columns(path: Path, table: Columns, needed: list[str]) -> None:
    missing = [name for name in needed if name not in table]
    if missing:
        raise ValueError(f"{path} has no column {', '.join(map(repr, missing))}; its columns: {list(table)}")
    if not next(iter(table.values()), []):
        raise ValueError(f"{path} has no data rows")


def feature_matrix(path: Path, table: Columns, features: list[str]) -> Tensor:
    """The feature columns as a float32 ``rows x features`` tensor; a missing or non-numeric value is refused."""
    columns = [[number(path, row, name, value) for row, value in enumerate(table[name], start=1)] for name in features]
    return torch.tensor(columns, dtype=torch.float32).T.contiguous()


def number(path: Path, row: int, column: str, value: object) -> float:
    where = f"{path}: row {row}, column {column!r}"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise ValueError(f"{where}: missing value (fill or drop it first)")
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(result):
        raise ValueError(f"{where}: missing value {value!r} (fill or drop it first)")
    return result


def class_indices(path: Path, column: str, labels: list) -> tuple[list[str], Tensor]:
    """The class names in a stable order (sorted; numerically when every label is a number) and each row's index."""
    for row, value in enumerate(labels, start=1):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise ValueError(f"{path}: row {row}, column {column!r} (the label): missing value (drop the row first)")
    distinct = set(labels)
    try:
        ordered = sorted(distinct, key=lambda value: (float(value), str(value)))
    except (TypeError, ValueError):
        ordered = sorted(distinct, key=str)
    index = {value: position for position, value in enumerate(ordered)}
    return [str(value) for value in ordered], torch.tensor([index[value] for value in labels], dtype=torch.long)
