"""What a run shows and leaves behind besides checkpoints and logs: the progress bar, test metrics, predictions."""

import csv
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """Lightning's Rich bar showing what a user reads: loss and accuracies to three decimals, samples/s as a whole
    number, no ``v_num`` (the run folder's number, which it prints as ``0.000``). The CLI adds it, updated every
    second batch, unless the config has a progress bar of its own."""

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        for name in ("samples_per_sec", "tflops_per_sec"):
            if isinstance(metrics.get(name), float):
                metrics[name] = f"{metrics[name]:,.0f}" if name == "samples_per_sec" else f"{metrics[name]:.3g}"
        return metrics


class TestMetricsWriter(Callback):
    """Writes the final test metrics to ``<log_dir>/test_metrics.json`` and prints them.

    ``trainer.callback_metrics`` already holds the values reduced across all ranks.
    """

    def __init__(self, filename: str = "test_metrics.json") -> None:
        self.filename = filename

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_dir = trainer.log_dir or trainer.default_root_dir  # log_dir broadcasts: every rank calls it
        if not trainer.is_global_zero:
            return
        metrics = {name: value.item() for name, value in trainer.callback_metrics.items()}
        path = Path(log_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        print(f"test metrics written to {path}: {json.dumps(metrics, sort_keys=True)}")


class PredictionsWriter(Callback):
    """Writes ``predict``'s outputs to ``<log_dir>/predictions.csv``: per input, a row of ``input`` (its index in the
    test split, or with ``data.predict_path`` the file's path or the table's row number), ``prediction`` (the class's
    name where the data has names, else its index) and one ``probability_<class>`` column per class; where an input
    of ``predict_path`` could not be read (the data module's ``unreadable_inputs``), a row for it at the end with the
    reason in an ``error`` column.

    Each rank predicts its own shard; the shards are gathered once and put back in data set order using the shard's
    sampler indices (the data module's ``predict_sampler``). Not a ``BasePredictionWriter``: Lightning then looks for
    batch indices, which exist only for DataLoaders, and warns on the tensor loader.
    """

    def __init__(self, filename: str = "predictions.csv") -> None:
        self.filename = filename
        self.outputs: list[torch.Tensor] = []

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.outputs = []

    def on_predict_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, *args: Any) -> None:
        self.outputs.append(outputs.cpu())

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_dir = trainer.log_dir or trainer.default_root_dir  # log_dir broadcasts: every rank calls it
        shard = (list(trainer.datamodule.predict_sampler), torch.cat(self.outputs).tolist() if self.outputs else [])
        shards = [shard]
        if dist.is_available() and dist.is_initialized():
            shards = [None] * dist.get_world_size()
            dist.all_gather_object(shards, shard)
        if not trainer.is_global_zero:
            return
        rows = sorted(row for indices, probabilities in shards for row in zip(indices, probabilities, strict=True))
        names = getattr(trainer.datamodule, "predict_names", None)
        width = len(rows[0][1]) if rows else 0
        classes = getattr(trainer.datamodule, "classes", None) or [str(index) for index in range(width)]
        unreadable = getattr(trainer.datamodule, "unreadable_inputs", [])
        path = Path(log_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            columns = ["input", "prediction", *(f"probability_{name}" for name in classes)]
            error = [""] if unreadable else []  # the error column, only where an input could not be read
            writer.writerow(columns + (["error"] if unreadable else []))
            for index, probabilities in rows:
                best = max(range(len(probabilities)), key=probabilities.__getitem__)
                row = [names[index] if names else index, classes[best], *(f"{p:.6g}" for p in probabilities)]
                writer.writerow(row + error)
            for name, reason in unreadable:  # a row each, with why: the file names every input given
                writer.writerow([name, *[""] * (len(columns) - 1), reason])
        skipped = f"; {len(unreadable)} inputs could not be read (rows with an error)" if unreadable else ""
        print(f"{len(rows)} predictions written to {path}{skipped}")
