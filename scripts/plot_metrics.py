"""Plots a run's loss and accuracy per epoch (train and val) from its CSVLogger ``metrics.csv`` to a PNG.

    python scripts/plot_metrics.py runs/digits                  # newest lightning_logs/version_N
    python scripts/plot_metrics.py runs/digits/lightning_logs/version_0 -o curves.png

Needs matplotlib (the ``plot`` extra). The values logged in an epoch are averaged: the epoch metrics (train_loss,
train_acc, val_*) are logged once, so they are taken as logged.
"""

import argparse
import csv
import math
import re
from collections import defaultdict
from pathlib import Path

PANELS = {"loss": ("train_loss", "val_loss"), "accuracy": ("train_acc", "val_acc")}


def find_metrics_csv(path: Path) -> Path:
    """PATH itself, PATH/metrics.csv, or the newest PATH/lightning_logs/version_N/metrics.csv."""
    if path.is_file():
        return path
    if (path / "metrics.csv").is_file():
        return path / "metrics.csv"
    versions = sorted(path.glob("lightning_logs/version_*/metrics.csv"), key=_version_number)
    if not versions:
        raise FileNotFoundError(f"no metrics.csv in {path} or {path}/lightning_logs/version_*/")
    return versions[-1]


def _version_number(metrics_csv: Path) -> int:
    match = re.fullmatch(r"version_(\d+)", metrics_csv.parent.name)
    return int(match.group(1)) if match else -1


def per_epoch(metrics_csv: Path) -> dict[str, dict[int, float]]:
    """{metric: {epoch: mean of the values logged in that epoch}} for the plotted metrics."""
    values: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    with metrics_csv.open(newline="") as file:
        for row in csv.DictReader(file):
            if not row.get("epoch"):  # e.g. the learning-rate monitor's rows
                continue
            for name in (name for panel in PANELS.values() for name in panel):
                if row.get(name):
                    values[name][int(row["epoch"])].append(float(row[name]))
    return {name: {epoch: math.fsum(v) / len(v) for epoch, v in epochs.items()} for name, epochs in values.items()}


def plot(curves: dict[str, dict[int, float]], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(1, len(PANELS), figsize=(11, 4), constrained_layout=True)
    for axis, (label, names) in zip(axes, PANELS.items(), strict=True):
        for name in names:
            if name in curves:
                epochs = sorted(curves[name])
                axis.plot(epochs, [curves[name][e] for e in epochs], marker="o", label=name)
        axis.set(xlabel="epoch", ylabel=label, title=label)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="metrics.csv, its log folder, or a run folder (newest version)")
    parser.add_argument("-o", "--output", type=Path, help="PNG to write (default: metrics.png beside metrics.csv)")
    args = parser.parse_args(argv)
    try:
        metrics_csv = find_metrics_csv(args.path)
    except FileNotFoundError as error:
        parser.error(str(error))
    curves = per_epoch(metrics_csv)
    if not curves:
        parser.error(f"{metrics_csv} has none of {sorted(n for panel in PANELS.values() for n in panel)}")
    out = args.output or metrics_csv.with_name("metrics.png")
    plot(curves, str(metrics_csv.parent), out)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
