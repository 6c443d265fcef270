"""Callbacks the CLI always adds: things every run should leave behind."""

import json
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer


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
