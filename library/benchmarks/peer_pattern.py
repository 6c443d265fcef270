"""The peer pattern: a LightningModule that logs its torchmetrics objects with ``self.log`` at every training step, as
lightning-hydra-template's ``MNISTLitModule`` does (a ``MeanMetric`` loss and an ``Accuracy``, both called as
``metric(...)`` and logged ``on_step=False, on_epoch=True``). What a textbook Lightning project costs a step, next to
bare Lightning and the template (benchmarks/ledger.py).
"""

from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import Accuracy

from benchmarks.bare_lightning import BareModule


class PeerModule(BareModule):
    def __init__(self, network: nn.Module, num_classes: int = 10) -> None:
        super().__init__(network)
        self.train_loss = MeanMetric()
        self.train_acc = Accuracy(task="multiclass", num_classes=num_classes)

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self.network(x)
        loss = self.loss_fn(logits, y)
        self.train_loss(loss)
        self.train_acc(logits.argmax(dim=1), y)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss
