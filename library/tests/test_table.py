"""Tables as data: TableDataModule's numbers (train-split standardisation, label order), a real fit and predict on a
generated CSV, and bad tables refused with exit 2, naming the file, the row and the column."""

import csv
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, quick_args, run_folder, run_project
from project.data import DigitsDataModule
from torch.utils.data import TensorDataset

from trainfleet.data import TableDataModule
from trainfleet.data.base import split
from trainfleet.main import main

TABLE_CONFIG = str(REPO / "configs" / "table.yaml")
SPECIES = ("owl", "cat", "emu")  # written unsorted: classes are sorted, cat=0 emu=1 owl=2


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as file:
        csv.writer(file).writerows([header, *rows])
    return path


def blobs(rows: int, seed: int = 0) -> list[list]:
    """Three separable classes in (x, y), an uninformative large column z, the species between them."""
    generator = torch.Generator().manual_seed(seed)
    table = []
    for row in range(rows):
        kind = row % 3
        x, y, z = torch.randn(3, generator=generator).tolist()
        table.append([f"{x * 0.5 + 4 * kind:.4f}", SPECIES[kind], f"{y * 0.5 - 3 * kind:.4f}", f"{1000 + 50 * z:.4f}"])
    return table


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    return write_csv(tmp_path_factory.mktemp("table") / "blobs.csv", ["x", "species", "y", "z"], blobs(240))


def test_features_are_standardised_with_the_training_split_statistics_only(table):
    data = TableDataModule(str(table), label="species", val_fraction=0.2, test_fraction=0.2, split_seed=3)
    data.setup("fit")
    raw = split(TensorDataset(data.values, data.labels), {"test": 0.2, "val": 0.2}, seed=3)
    train = raw["train"].tensors[0]
    assert data.features == ["x", "y", "z"] and data.input_shape == (3,)
    assert torch.allclose(data.mean, train.mean(dim=0)) and torch.allclose(data.std, train.std(dim=0, correction=0))
    assert not torch.allclose(data.mean, data.values.mean(dim=0))  # the whole table's statistics differ
    for name in ("train", "val", "test"):
        expected = (raw[name].tensors[0] - train.mean(dim=0)) / train.std(dim=0, correction=0)
        assert torch.allclose(data.splits[name].tensors[0], expected)
        assert torch.equal(data.splits[name].tensors[1], raw[name].tensors[1])
    standardised = data.splits["train"].tensors[0]
    assert torch.allclose(standardised.mean(dim=0), torch.zeros(3), atol=1e-5)
    assert torch.allclose(standardised.std(dim=0, correction=0), torch.ones(3), atol=1e-5)


@pytest.mark.parametrize(
    ("labels", "classes"),
    [
        (["owl", "cat", "emu", "cat"], ["cat", "emu", "owl"]),
        (["10", "9", "2", "9"], ["2", "9", "10"]),  # numbers sort as numbers, not as text
        (["b", "10", "a", "9"], ["10", "9", "a", "b"]),  # mixed: as text
    ],
)
def test_labels_of_any_type_map_to_classes_in_sorted_order(tmp_path, labels, classes):
    path = write_csv(tmp_path / "t.csv", ["f", "label"], [[index, label] for index, label in enumerate(labels)])
    data = TableDataModule(str(path), label="label")
    assert data.classes == classes and data.num_classes == len(classes)
    assert [data.classes[index] for index in data.labels.tolist()] == labels


def test_parquet_is_read_with_typed_columns_and_its_nulls_refused(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    path = tmp_path / "t.parquet"
    parquet.write_table(pyarrow.table({"f": [0.5, 1.5, 2.5], "g": [1, 2, 3], "ok": [True, False, True]}), path)
    data = TableDataModule(str(path), label="ok", features=["g", "f"])
    assert data.classes == ["False", "True"] and data.labels.tolist() == [1, 0, 1]
    assert data.values.tolist() == [[1, 0.5], [2, 1.5], [3, 2.5]]
    parquet.write_table(pyarrow.table({"f": [0.5, None], "ok": [True, False]}), path)
    with pytest.raises(ValueError, match=r"1 of 2 rows of .*t\.parquet cannot be read: row 2 \(column 'f': missing"):
        TableDataModule(str(path), label="ok")


def test_parquet_without_pyarrow_is_refused_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"t\.parquet needs pyarrow: pip install -e '\.\[table\]'"):
        TableDataModule(str(tmp_path / "t.parquet"), label="ok")


def test_a_data_module_that_cannot_read_new_inputs_refuses_predict_path(tmp_path):
    with pytest.raises(ValueError, match="DigitsDataModule cannot read new inputs"):
        DigitsDataModule(predict_path=str(tmp_path))


def table_args(run_dir: Path, path: Path, *extra: str) -> list[str]:
    flags = ("--config", TABLE_CONFIG, "--trainer.default_root_dir", str(run_dir))  # after the overlay's own
    flags += ("--data.init_args.path", str(path), "--data.init_args.label", "species")
    return quick_args(run_dir, *flags, *extra)


@pytest.mark.parametrize(
    ("cell", "message"),
    [("", "row 3 (column 'y': missing value)"), ("n/a", "row 3 (column 'y': 'n/a' is not a number)")],
    ids=["empty", "text"],
)
def test_a_missing_or_non_numeric_value_exits_2_naming_file_row_and_column(
    tmp_path, monkeypatch, capsys, cell, message
):
    rows = blobs(4)
    rows[2][2] = cell
    path = write_csv(tmp_path / "holes.csv", ["x", "species", "y", "z"], rows)
    monkeypatch.setattr(sys, "argv", ["project"])
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *table_args(tmp_path / "run", path)])
    assert exit_info.value.code == 2
    assert f"1 of 4 rows of {path} cannot be read: {message}; fix or remove them" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def fitted(table, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("table_fit")
    result = run_project("fit", *table_args(run_dir, table, "--trainer.max_epochs", "8"), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_a_fit_on_a_csv_learns_a_separable_problem(fitted, table, tmp_path):
    checkpoint = str(run_folder(fitted) / "checkpoints" / "last.ckpt")
    result = run_project("test", *table_args(tmp_path, table, "--ckpt_path", checkpoint), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"test_acc": 1.0' in result.stdout  # 48 held-out rows, classes 4 standard deviations apart


@pytest.mark.slow
def test_predict_on_a_new_csv_writes_row_class_name_and_probabilities(fitted, table, tmp_path):
    new = [row[:1] + row[2:] for row in blobs(9, seed=1)]  # no label column: x, y, z
    inputs = write_csv(tmp_path / "new.csv", ["x", "y", "z"], new)
    checkpoint = str(run_folder(fitted) / "checkpoints" / "last.ckpt")
    flags = ("--data.init_args.predict_path", str(inputs), "--ckpt_path", checkpoint, "--trainer.devices", "2")
    result = run_project("predict", *table_args(tmp_path / "run", table, *flags), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    with (run_folder(tmp_path / "run") / "predictions.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["input", "prediction", "probability_cat", "probability_emu", "probability_owl"]
    assert [row["input"] for row in rows] == [str(row) for row in range(1, 10)]  # in file order, across 2 ranks
    assert [row["prediction"] for row in rows] == [SPECIES[row % 3] for row in range(9)]
    for row in rows:
        probabilities = [float(row[f"probability_{name}"]) for name in ("cat", "emu", "owl")]
        assert sum(probabilities) == pytest.approx(1, abs=1e-5)
        assert max(probabilities) == float(row[f"probability_{row['prediction']}"])


def test_malformed_rows_are_listed_all_at_once_and_skipped_with_the_switch(tmp_path, capsys):
    rows = blobs(30)
    rows[2][2], rows[5][0], rows[9][1] = "", "n/a", ""  # a missing value, a word, a missing label
    rows[12] = rows[12][:3]  # a line cut short
    path = write_csv(tmp_path / "holes.csv", ["x", "species", "y", "z"], rows)
    with pytest.raises(ValueError) as refused:
        TableDataModule(str(path), label="species")
    assert str(refused.value) == (
        f"4 of 30 rows of {path} cannot be read: row 3 (column 'y': missing value), row 6 (column 'x': 'n/a' is not"
        " a number), row 10 (column 'species': missing value) and 1 more; fix or remove them, or give"
        " --data.init_args.skip_unreadable true to train without them"
    )
    data = TableDataModule(str(path), label="species", skip_unreadable=True)
    assert len(data.labels) == 26 and data.values.shape == (26, 3)
    assert f"training without 4 of 30 rows of {path} that cannot be read (skip_unreadable)" in capsys.readouterr().err
