"""Writes scikit-learn's bundled wine data as a table, for trying the table path without data of your own.

178 wines, 13 measurements each, the grape cultivar (``class_0``..``class_2``) in the ``class`` column; no download::

    python scripts/write_table.py data/wine.csv        # or data/wine.parquet (the `table` extra: pyarrow)
    python -m project fit --config configs/digits.yaml --config configs/table.yaml \\
        --data.init_args.path data/wine.csv
"""

import argparse
import csv
from pathlib import Path


def write_wine(path: Path) -> Path:
    from sklearn.datasets import load_wine

    wine = load_wine()
    columns = {name: wine.data[:, index].tolist() for index, name in enumerate(wine.feature_names)}
    columns["class"] = [str(wine.target_names[target]) for target in wine.target]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow
        import pyarrow.parquet

        pyarrow.parquet.write_table(pyarrow.table(columns), path)
        return path
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values(), strict=True))
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="the .csv or .parquet file to write")
    print(f"wrote {write_wine(parser.parse_args().path)}")
