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

from trainfleet.data.base import split
from trainfleet.data.in_memory import InMemoryDataModule
from trainfleet.data.unreadable import refuse_or_skip

Columns = dict[str, list]  # column name: its values, row by row


class TableDataModule(InMemoryDataModule):
    """Classifies the rows of a CSV or Parquet file by one of its columns.

    The file is read when the module is built, so a bad file stops the run (exit 2) before any process starts: a
    missing column, or rows with a missing or non-numeric value or a CSV line of another length than the header, all
    counted and the first few named with the row (1 for the first data row; the CSV line is one more, for the header)
    and the column; ``skip_unreadable`` trains without those rows instead. Labels may be of any type (numbers,
    strings, booleans): class ``i`` is the ``i``-th label in sorted order (numerically when every label is a number),
    so the same labels give the same indices in every run; their names are in ``classes`` and in the predictions
    file.

    Args:
        path: the ``.csv`` (comma-separated, a header row) or ``.parquet`` file.
        label: the column to predict.
        features: the input columns, in order (``None``: every column but ``label``).
        skip_unreadable: leave out the malformed rows (of the table and of ``predict_path``), saying how many
            (``False``: refuse them, listed, before anything starts).
        **kwargs: the ``BaseDataModule`` arguments (batch_size, val_fraction, test_fraction, split_seed, predict_path,
            ...). ``predict_path``: a table with the same feature columns (its label column, if any, is not read).
    """

    def __init__(
        self, path: str, label: str, features: list[str] | None = None, skip_unreadable: bool = False, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        table = read_table(Path(path))
        self.features = features if features is not None else [name for name in table if name != label]
        check_columns(Path(path), table, [label, *self.features])
        table = well_formed(Path(path), table, [label, *self.features], skip_unreadable, label)
        self.classes, self.labels = class_indices(Path(path), label, table[label])
        self.values = feature_matrix(Path(path), table, self.features)
        self.num_classes = len(self.classes)
        self.input_shape = (len(self.features),)
        self.new_inputs = None
        if self.hparams.predict_path is not None:  # read now: a bad file is refused before anything runs
            inputs = read_table(Path(self.hparams.predict_path))
            check_columns(Path(self.hparams.predict_path), inputs, self.features)
            inputs = well_formed(Path(self.hparams.predict_path), inputs, self.features, skip_unreadable)
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
        for row in reader:
            if len(row) != len(header):  # every cell says why, for well_formed to list
                row = [Ragged(f"the line has {len(row)} values, the header {len(header)}")] * len(header)
            for name, value in zip(header, row, strict=True):
                columns[name].append(value if value.strip() else None)
    return columns


class Ragged(str):
    """A cell of a CSV line with more or fewer values than the header: its text is the reason."""


def well_formed(path: Path, table: Columns, needed: list[str], skip: bool, label: str | None = None) -> Columns:
    """TABLE less its rows that cannot be used (``row_problem``), refused, all listed, unless SKIP."""
    rows = len(table[needed[0]])
    problems = {f"row {row + 1}": problem for row in range(rows) if (problem := row_problem(table, row, needed, label))}
    refuse_or_skip(problems, rows, f"rows of {path}", skip)
    kept = [row for row in range(rows) if f"row {row + 1}" not in problems]
    return {name: [values[row] for row in kept] for name, values in table.items()}


def row_problem(table: Columns, row: int, needed: list[str], label: str | None) -> str | None:
    """Why ROW cannot be used: its first bad cell in NEEDED (LABEL's may be any value but a missing one), or None."""
    for name in needed:
        value = table[name][row]
        if isinstance(value, Ragged):
            return str(value)
        problem = ("missing value" if missing(value) else None) if name == label else cell_problem(value)
        if problem:
            return f"column {name!r}: {problem}"
    return None


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
    problem = cell_problem(value)
    if problem:
        raise ValueError(f"{path}: row {row}, column {column!r}: {problem}")
    return float(value)


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def cell_problem(value: object) -> str | None:
    """Why VALUE is not a feature value, or None."""
    if missing(value):
        return "missing value"
    try:
        result = float(value)
    except (TypeError, ValueError):
        return f"{value!r} is not a number"
    return None if math.isfinite(result) else f"missing value {value!r}"


def class_indices(path: Path, column: str, labels: list) -> tuple[list[str], Tensor]:
    """The class names in a stable order (sorted; numerically when every label is a number) and each row's index
    (``well_formed`` has left out the rows without one)."""
    distinct = set(labels)
    try:
        ordered = sorted(distinct, key=lambda value: (float(value), str(value)))
    except (TypeError, ValueError):
        ordered = sorted(distinct, key=str)
    index = {value: position for position, value in enumerate(ordered)}
    return [str(value) for value in ordered], torch.tensor([index[value] for value in labels], dtype=torch.long)
