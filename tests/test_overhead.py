"""What Lightning's calls cost per step: hooks inherited as no-ops are skipped, and no profiler means no context."""

import sys

import pytest
import torch
from conftest import DIGITS_CONFIG
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.profilers import SimpleProfiler

from project.cli import ProjectCLI
from project.data import DigitsDataModule, InMemoryDataModule
from project.module import ClassificationModule
from project.networks import MLP
from project.runtime.guard import RunGuard
from project.runtime.lightning_internals import NoProfiler


class CountsBackward(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_after_backward(self, trainer, pl_module) -> None:
        self.calls += 1


def test_callbacks_are_called_only_at_the_batch_hooks_they_implement_and_checkpoints_where_they_can_save(tmp_path):
    data = DigitsDataModule()
    module = ClassificationModule(MLP(data.num_classes, data.input_shape), data.num_classes)
    counter = CountsBackward()
    by_epoch = ModelCheckpoint(dirpath=tmp_path / "epoch")
    by_steps = ModelCheckpoint(dirpath=tmp_path / "steps", every_n_train_steps=3, save_top_k=-1)
    saves_nothing = ModelCheckpoint(dirpath=tmp_path / "none", save_top_k=0, save_last=False, every_n_epochs=2)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=7,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        use_distributed_sampler=False,
        callbacks=[RunGuard(), counter, by_epoch, by_steps, saves_nothing],
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data)
    assert counter.calls == 7  # an implemented hook: called every step
    assert counter.on_train_batch_end is None and by_epoch.on_after_backward is None  # inherited no-ops: skipped
    assert callable(counter.on_after_backward)
    # The module's training-step no-ops too; its evaluation hooks stay, as Lightning reads their signatures.
    assert module.on_before_backward is None and module.on_train_batch_end is None
    assert callable(module.on_validation_batch_start)
    evaluator = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, use_distributed_sampler=False)
    [metrics] = evaluator.validate(module, data, verbose=False)
    images, labels = data.splits["val"].tensors
    with torch.no_grad():
        assert metrics["val_acc"] == pytest.approx((module(images).argmax(dim=1) == labels).float().mean().item())
    # ModelCheckpoint's batch hook only where a step or time trigger can save, its epoch hooks where anything can.
    assert by_epoch.on_train_batch_end is None and callable(by_epoch.on_train_epoch_end)
    assert callable(by_steps.on_train_batch_end)
    assert saves_nothing.on_train_epoch_end is None and saves_nothing.on_validation_end is None
    assert trainer.global_step == 7
    assert sorted(path.name for path in (tmp_path / "epoch").iterdir()) == ["epoch=0-step=7.ckpt"]
    assert {"epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"} <= {path.name for path in (tmp_path / "steps").iterdir()}
    assert not (tmp_path / "none").exists()


def test_without_a_profiler_in_the_config_each_hook_gets_one_shared_empty_context(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # pytest's own arguments are not the CLI's
    args = ["--config", str(DIGITS_CONFIG), "--trainer.default_root_dir", str(tmp_path)]
    cli = ProjectCLI(ClassificationModule, InMemoryDataModule, subclass_mode_data=True, run=False, args=args)
    profiler = cli.trainer.profiler
    assert type(profiler) is NoProfiler
    with profiler.profile("[Callback]RunGuard.on_train_batch_end") as outer, profiler.profile("nested") as inner:
        assert outer is inner is None
    assert profiler.profile("a") is profiler.profile("b")
    args += ["--trainer.profiler", "simple"]
    cli = ProjectCLI(ClassificationModule, InMemoryDataModule, subclass_mode_data=True, run=False, args=args)
    assert type(cli.trainer.profiler) is SimpleProfiler  # a profiler of the config's own is kept
