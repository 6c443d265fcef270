"""The LightningModule: an injected network trained with cross-entropy and (by default) SGD.

Metrics are torchmetrics objects declared once (``stage_metrics``), cloned per stage and logged as objects: each
rank accumulates its own counts and they are summed across ranks once, at epoch end. No per-step collective runs,
so ranks with uneven evaluation shards never wait on each other. Their updates are batched over steps
(``batched_metrics.py``): torchmetrics' per-call cost is then paid once per window, not once per step.
"""

import math
from typing import Any, Literal, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy
from trainfleet import time_budget
from trainfleet.batched_metrics import BatchedUpdates
from trainfleet.messages import report

from project.schedules import WarmupCosineLR

STAGES = ("train", "val", "test")


def stage_metrics(num_classes: int) -> MetricCollection:
    """The metrics of every stage, each updated with ``(logits, labels)`` and logged as ``{stage}_{name}``: add yours
    here, one line. Each must sum exactly across ranks at epoch end (counts, not per-rank means) and do no host sync
    per step (``validate_args=False``: the label checks would). ``{stage}_loss`` is the module's own, below."""
    # average="micro" is plain accuracy; torchmetrics' default ("macro") is the per-class mean.
    return MetricCollection({"acc": MulticlassAccuracy(num_classes, average="micro", validate_args=False)})


def several_processes() -> bool:
    """Whether a metric's states are summed across processes at compute: not in a process group of one (the template's
    one-process run), where torchmetrics would still gather each state (a collective each, every epoch)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@runtime_checkable
class ShardsNetworks(Protocol):
    """A strategy that shards a network in place once the process group is up (``FSDP2Strategy``, configs/fsdp.yaml):
    the module hands it its network without knowing the strategy's class."""

    def shard(self, network: nn.Module) -> None: ...


class ClassificationModule(LightningModule):
    """Classifies with ``network``; ``optimizer`` and ``scheduler`` come from config.

    Args:
        network: any ``nn.Module`` mapping a batch of inputs to ``num_classes`` logits.
        num_classes: linked from the data module by the CLI.
        label_smoothing: passed to ``CrossEntropyLoss``.
        optimizer: called with the parameters; SGD by default (lr, momentum, ... in the config). The one place to set
            it: the CLI has no ``--optimizer``/``--lr_scheduler`` of its own.
        scheduler: optional, called with the optimizer. ``project.schedules.WarmupCosineLR`` (warm-up, then cosine
            to the end of the run) gets the run's length here, when training starts.
        scheduler_interval: step the scheduler after every optimizer ``step`` or at the end of every ``epoch`` (for
            torch schedulers counted in epochs, e.g. ``StepLR``'s ``step_size``).
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
        scheduler_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
        channels_last: bool = False,
        matmul_precision: Literal["highest", "high", "medium"] | None = None,
    ) -> None:
        super().__init__()
        if not 0 <= label_smoothing <= 1:  # torch's loss takes it, and fails at the first step
            raise ValueError(f"model.label_smoothing must be in [0, 1] (0: none), got {label_smoothing}")
        # With LightningCLI this stores the parsed config (class paths, not objects): weights-only safe.
        self.save_hyperparameters()
        self.network = network
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.channels_last = channels_last
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        metrics = stage_metrics(num_classes)
        # Keyed "{stage}_metrics", "{stage}_loss": nn.Module has a `train` attribute, so "train" cannot be a key.
        self.metrics = nn.ModuleDict({f"{stage}_metrics": metrics.clone(prefix=f"{stage}_") for stage in STAGES})
        # The loss: each batch's mean loss once per sample, averaged (the exact per-sample mean across ranks) in two
        # scalar states. nan_strategy "disable": no host sync per step (NaNGuard checks training losses); it also
        # drops `weight` (torchmetrics 1.9), so each sample counts through its own value.
        self.losses = nn.ModuleDict({f"{stage}_loss": MeanMetric(nan_strategy="disable") for stage in STAGES})
        self.updates = {
            stage: BatchedUpdates(self.losses[f"{stage}_loss"], self.metrics[f"{stage}_metrics"]) for stage in STAGES
        }
        self.pace_meter: time_budget.PaceMeter | None = None  # a max_time run's pace, until its schedule is fitted
        self.window_losses: list[Tensor] = []  # the training losses since the loss curve's last point
        for metric in self.modules():
            if isinstance(metric, Metric):  # torchmetrics' constructor argument, for every metric stage_metrics lists
                metric.distributed_available_fn = several_processes

    def configure_model(self) -> None:
        """The speed switches and, under FSDP2 (configs/fsdp.yaml), the network's sharding by the strategy's policy:
        applied once per process before training or evaluation starts."""
        if self.hparams.matmul_precision:
            torch.set_float32_matmul_precision(self.hparams.matmul_precision)
        if self.channels_last:
            self.network.to(memory_format=torch.channels_last)
        if self.device_mesh is not None and isinstance(self.trainer.strategy, ShardsNetworks):
            self.trainer.strategy.shard(self.network)
        if self.hparams.compile:
            self.network.compile(**(self.hparams.compile if isinstance(self.hparams.compile, dict) else {}))

    def forward(self, x: Tensor) -> Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.network(x)

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def predict_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        """Each input's class probabilities (runs/outputs.py writes them with the predicted class)."""
        return self(batch[0]).softmax(dim=1)

    def _step(self, batch: list[Tensor], stage: str) -> Tensor:
        """The batch's loss; the stage's metrics get its (detached) loss, logits and labels."""
        x, y = batch
        logits = self(x)
        loss = self.loss_fn(logits, y)
        self.updates[stage].add(loss, logits, y)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """The loss curve, ``train_loss_step``: each ``log_every_n_steps`` window's mean loss, logged once a window
        (a self.log call per step would cost Lightning more than a small CPU step's work: the library's
        performance page)."""
        self.window_losses.append(outputs["loss"].detach() if isinstance(outputs, dict) else outputs.detach())
        if self.trainer.global_step % self.trainer.log_every_n_steps == 0:  # at the logging steps: a resumed run's too
            mean, self.window_losses = torch.stack(self.window_losses).mean(), []
            if self.trainer.loggers or self.trainer.progress_bar_callback:
                self.log("train_loss_step", mean, prog_bar=True, on_step=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.window_losses = []  # a run resumed from here starts its window here: its curve is the uninterrupted one

    # Metric objects are logged once per epoch: each rank counts its own samples, summed across ranks at compute.
    def on_train_epoch_end(self) -> None:
        self._log_epoch_metrics("train")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics("test")

    def _log_epoch_metrics(self, stage: str) -> None:
        self.updates[stage].flush()
        self.log(f"{stage}_loss", self.losses[f"{stage}_loss"], prog_bar=True)
        self.log_dict(self.metrics[f"{stage}_metrics"], prog_bar=True)

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer(self.parameters())
        if self.scheduler is None:
            return optimizer
        scheduler = {"scheduler": self.scheduler(optimizer), "interval": self.hparams.scheduler_interval}
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def on_train_start(self) -> None:
        """Ties a ``WarmupCosineLR`` without ``total_steps`` to this run's length. Here, not in
        ``configure_optimizers``: the estimate loads the training data, which there would be before a resumed run's
        loader position is restored, and the position would be lost (Lightning issue #20550). With ``max_time`` the
        length is provisional until the pace is measured (``lr_scheduler_step``); a resumed run keeps its estimate."""
        self.pace_meter = None
        for config in self.trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if not isinstance(scheduler, WarmupCosineLR) or scheduler.user_total_steps is not None:
                continue
            if config.interval != "step":
                scheduler.fit_to(int(self.trainer.max_epochs))
                continue
            steps = self.trainer.estimated_stepping_batches
            bound = None if math.isinf(steps) else int(steps)
            timer = time_budget.run_timer(self.trainer)
            if timer is None:
                scheduler.fit_to(int(steps))
            elif scheduler.estimate is None:  # a fresh run, or one resumed before its pace was measured
                scheduler.hold(bound)
                self.pace_meter = time_budget.PaceMeter(timer, bound, self.trainer.global_step)
            elif self.trainer.is_global_zero:
                report(f"schedule: {type(scheduler).__name__} keeps the {scheduler.total_steps} steps estimated before")

    def lr_scheduler_step(self, scheduler: Any, metric: Any | None) -> None:
        """Fits a provisional ``WarmupCosineLR`` to the ``max_time`` run's estimated length once the pace is timed:
        before the step, so the checkpoints of this step on hold the fitted length. Every rank takes rank 0's
        estimate (one schedule, the same rates on every rank)."""
        if self.pace_meter is not None and isinstance(scheduler, WarmupCosineLR) and scheduler.provisional:
            estimate = self.pace_meter.estimate(self.trainer.global_step)
            if estimate is not None:
                estimate = self.trainer.strategy.broadcast(estimate, src=0)
                scheduler.fit_to(estimate.total_steps(scheduler.warmup_steps), estimate.as_dict())
                self.pace_meter = None
                if self.trainer.is_global_zero:
                    report(estimate.line(type(scheduler).__name__, scheduler.warmup_steps))
        super().lr_scheduler_step(scheduler, metric)
