"""The LightningModule: an injected network trained with cross-entropy and (by default) SGD.

Metrics are torchmetrics objects, one per stage, logged as objects: each rank accumulates its
own counts and they are summed across ranks once, at epoch end. No per-step collective runs,
so ranks with uneven evaluation shards never wait on each other.
"""

from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

# Training steps whose logits are kept before they are counted: memory is this many steps' logits (batch x classes).
TRAIN_ACC_WINDOW = 16


class ClassificationModule(LightningModule):
    """Classifies with ``network``; ``optimizer`` and ``scheduler`` come from config.

    Args:
        network: any ``nn.Module`` mapping a batch of inputs to ``num_classes`` logits.
        num_classes: linked from the data module by the CLI.
        label_smoothing: passed to ``CrossEntropyLoss``.
        optimizer: called with the parameters; SGD by default (lr, momentum, ... in the config).
        scheduler: optional, called with the optimizer; stepped once per epoch.
        compile: ``torch.compile`` the network (``true``, or its options: ``{mode: max-autotune, fullgraph: true}``).
            Compiled in place (``nn.Module.compile``), so checkpoints are the same with and without it.
        channels_last: convolution weights and 4-D inputs in NHWC layout, which GPU convolution kernels prefer.
        matmul_precision: ``torch.set_float32_matmul_precision``: ``high`` lets float32 matmuls use TF32 on
            Ampere+ GPUs (``highest``, torch's default, does not).
    """

    def __init__(
        self,
        network: nn.Module,
        num_classes: int,
        label_smoothing: float = 0.0,
        optimizer: OptimizerCallable = torch.optim.SGD,
        scheduler: LRSchedulerCallable | None = None,
        compile: bool | dict[str, Any] = False,
        channels_last: bool = False,
        matmul_precision: Literal["highest", "high", "medium"] | None = None,
    ) -> None:
        super().__init__()
        # With LightningCLI this stores the parsed config (class paths, not objects): weights-only safe.
        self.save_hyperparameters()
        self.network = network
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.channels_last = channels_last
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # Training accuracy: each step keeps its (detached) logits and targets; every TRAIN_ACC_WINDOW steps they are
        # counted in one go (per step, argmax-compare-sum cost about 0.15 ms, 5% of a small CPU step), and at epoch
        # end one all-reduce of the counts gives the exact accuracy over every rank's samples.
        self.train_counts: dict[str, Any] = {"correct": 0, "seen": 0}  # a dict: no nn.Module attribute per step
        self.train_outputs: list[tuple[Tensor, Tensor]] = []
        # Whether anything reads train_loss and train_acc (see _is_read): asked once per fit, at its start.
        self.log_train_loss = self.count_train_acc = True
        # average="micro" is plain accuracy; torchmetrics' default ("macro") is per-class mean.
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def configure_model(self) -> None:
        """The speed switches, applied once per process before training or evaluation starts."""
        if self.hparams.matmul_precision:
            torch.set_float32_matmul_precision(self.hparams.matmul_precision)
        if self.channels_last:
            self.network.to(memory_format=torch.channels_last)
        if self.hparams.compile:
            self.network.compile(**(self.hparams.compile if isinstance(self.hparams.compile, dict) else {}))

    def forward(self, x: Tensor) -> Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.network(x)

    def on_train_start(self) -> None:
        self.log_train_loss, self.count_train_acc = self._is_read("train_loss"), self._is_read("train_acc")
        self.train_outputs.clear()  # a resumed epoch counts from here (the counts are not in checkpoints)
        self.train_counts.update(correct=0, seen=0)

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self.loss_fn(logits, y)
        if self.count_train_acc:
            self.train_outputs.append((logits.detach(), y))
            if len(self.train_outputs) == TRAIN_ACC_WINDOW:
                self.count_train_outputs()
        if self.log_train_loss and self._is_logging_step():
            self.log("train_loss", loss, prog_bar=True)
        return loss

    def _is_logging_step(self) -> bool:
        """Only the steps the logger writes."""
        trainer = self._trainer  # None when the module is used on its own
        return trainer is None or (trainer.global_step + 1) % trainer.log_every_n_steps == 0

    def _is_read(self, name: str) -> bool:
        """A self.log call costs about a millisecond: log NAME only when a logger, the progress bar or a callback's
        monitor (ModelCheckpoint, EarlyStopping) reads it. The same answer on every rank."""
        trainer = self._trainer
        if trainer is None or trainer.loggers or trainer.progress_bar_callback:
            return True
        return any(getattr(callback, "monitor", None) == name for callback in trainer.callbacks)

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        return self(batch[0]).argmax(dim=1)

    def _evaluate(self, batch: list[Tensor], stage: str) -> None:
        x, y = batch
        logits = self(x)
        # Weighted by batch size so the epoch loss is the exact per-sample mean across all ranks.
        getattr(self, f"{stage}_loss").update(self.loss_fn(logits, y), weight=len(y))
        getattr(self, f"{stage}_acc").update(logits, y)

    # Metric objects are logged once per epoch, not per step: each log call moves the metric's states.
    def on_train_epoch_end(self) -> None:
        if not self.count_train_acc:
            return
        accuracy = self.train_accuracy()
        if accuracy is not None:
            self.log("train_acc", accuracy)

    def count_train_outputs(self) -> None:
        """Adds the kept steps' correct predictions and samples to the epoch's counts."""
        if not self.train_outputs:
            return
        logits, targets = (torch.cat(parts) for parts in zip(*self.train_outputs, strict=True))
        self.train_outputs.clear()
        counts = self.train_counts
        counts["correct"] = counts["correct"] + (logits.argmax(dim=1) == targets).sum()
        counts["seen"] += len(targets)

    def train_accuracy(self) -> Tensor | None:
        """The epoch's training accuracy over every rank's samples (None if none were seen), and a new count.

        One all-reduce of (correct, seen): a torchmetrics object logged instead costs its states' all-gathers and
        about 2 ms of Lightning's logging an epoch.
        """
        self.count_train_outputs()
        counts = torch.stack([torch.as_tensor(value, device=self.device) for value in self.train_counts.values()])
        self.train_counts.update(correct=0, seen=0)
        if self._trainer is not None:
            counts = self.trainer.strategy.reduce(counts, reduce_op="sum")  # int64: exact at any count
        correct, seen = counts
        return correct.float() / seen if seen else None

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics("test")

    def _log_epoch_metrics(self, stage: str) -> None:
        self.log(f"{stage}_loss", getattr(self, f"{stage}_loss"), prog_bar=True)
        self.log(f"{stage}_acc", getattr(self, f"{stage}_acc"), prog_bar=True)

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer(self.parameters())
        if self.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.scheduler(optimizer)}
