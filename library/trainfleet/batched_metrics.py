"""Metric updates batched over steps: torchmetrics' ``update`` runs once per window of steps, not once per step.

``Metric.update`` costs tens of microseconds of Python a call whatever the batch (argument formatting, state
bookkeeping): on the digits MLP's 1 ms step, the loss's and the accuracy's updates were a fifth of the step
(docs/performance.md). Their inputs are held on their device instead and given to the metrics concatenated, which
gives the same counts and sums (up to float rounding for the loss) in one call per window.
"""

import torch
from torch import Tensor
from torchmetrics import MeanMetric, MetricCollection

MAX_HELD_ELEMENTS = 2**20  # 4 MiB of float32 logits: a small batch's metrics update once an epoch, a large one's often


class BatchedUpdates:
    """One stage's loss and metrics, updated when the logits held keep ``MAX_HELD_ELEMENTS`` elements alive and when
    ``flush`` is called (the module does before it logs them: whoever reads the metrics mid-window flushes first)."""

    def __init__(self, loss: MeanMetric, metrics: MetricCollection) -> None:
        self.loss, self.metrics = loss, metrics
        self.held: list[tuple[Tensor, Tensor, Tensor]] = []  # (each sample's loss, logits, labels), detached
        self.held_elements = 0

    def add(self, loss: Tensor, logits: Tensor, labels: Tensor) -> None:
        """Holds one batch: its mean loss (counted once per sample) and its logits and labels."""
        self.held.append((loss.detach().expand(len(labels)), logits.detach(), labels))
        # What holding them keeps alive: their whole storage, larger than them when they are a view (a slice of a
        # network's output).
        self.held_elements += logits.untyped_storage().nbytes() // logits.element_size()
        if self.held_elements >= MAX_HELD_ELEMENTS:
            self.flush()

    def flush(self) -> None:
        """Updates the loss and metrics with every batch held."""
        if not self.held:
            return
        losses, logits, labels = (torch.cat(parts) for parts in zip(*self.held, strict=True))
        self.held, self.held_elements = [], 0
        self.loss.update(losses)
        self.metrics.update(logits, labels)
