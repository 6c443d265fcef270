"""What the template's callbacks cost per step: Lightning calls a callback only at the batch hooks it implements."""

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from project.callbacks import RunGuard
from project.data import DigitsDataModule
from project.module import ClassificationModule
from project.networks import MLP


class CountsBackward(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_after_backward(self, trainer, pl_module) -> None:
        self.calls += 1


def test_callbacks_are_called_only_at_the_batch_hooks_they_implement(tmp_path):
    data = DigitsDataModule()
    module = ClassificationModule(MLP(data.num_classes, data.input_shape), data.num_classes)
    counter, checkpoint = CountsBackward(), ModelCheckpoint(dirpath=tmp_path)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=7,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        use_distributed_sampler=False,
        callbacks=[RunGuard(), counter, checkpoint],
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data)
    assert counter.calls == 7  # an implemented hook: called every step
    assert counter.on_train_batch_end is None and checkpoint.on_after_backward is None  # inherited no-ops: skipped
    assert callable(checkpoint.on_train_batch_end) and callable(counter.on_after_backward)
    assert trainer.global_step == 7 and (tmp_path / "epoch=0-step=7.ckpt").is_file()  # ModelCheckpoint still saves
