"""The speed switches on CPU, for real: torch.compile (inductor), bf16-mixed, channels_last. Each reaches the accuracy
target, and checkpoints load into an uncompiled module (and back) with the same results."""

import json

import pytest
import torch
from conftest import checkpoint_dir, quick_args, run_folder, run_in_process
from lightning.pytorch import Trainer

from project.data import DigitsDataModule
from project.module import ClassificationModule

EPOCHS = ("--trainer.max_epochs", "20")


def final_metrics(root) -> dict[str, float]:
    return json.loads((run_folder(root) / "test_metrics.json").read_text())


def evaluate(module: ClassificationModule) -> float:
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
    [metrics] = trainer.test(module, DigitsDataModule(), verbose=False)
    return metrics["test_acc"]


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled")
    args = quick_args(root, *EPOCHS, "--model.compile", "true")
    run_in_process("fit", *args)
    run_in_process("test", *args, "--ckpt_path", "last")
    return root


def test_a_compiled_network_trains_to_the_target_and_its_checkpoint_loads_uncompiled(compiled_run, tmp_path):
    assert final_metrics(compiled_run)["test_acc"] >= 0.90
    ckpt = checkpoint_dir(compiled_run) / "last.ckpt"
    assert not any("_orig_mod" in key for key in torch.load(ckpt, weights_only=True)["state_dict"])
    uncompiled = ClassificationModule.load_from_checkpoint(ckpt, compile=False)
    assert evaluate(uncompiled) == pytest.approx(final_metrics(compiled_run)["test_acc"], abs=1e-6)


def test_bf16_mixed_precision_on_cpu_reaches_the_target(tmp_path):
    args = quick_args(tmp_path, *EPOCHS, "--trainer.precision", "bf16-mixed")
    run_in_process("fit", *args)
    run_in_process("test", *args, "--ckpt_path", "last")
    assert final_metrics(tmp_path)["test_acc"] >= 0.90


def test_channels_last_cnn_reaches_the_target_and_keeps_its_layout(tmp_path):
    args = quick_args(
        tmp_path, *EPOCHS, "--model.network", "project.networks.SmallCNN", "--model.channels_last", "true"
    )
    run_in_process("fit", *args)
    run_in_process("test", *args, "--ckpt_path", "last")
    assert final_metrics(tmp_path)["test_acc"] >= 0.90
    module = ClassificationModule.load_from_checkpoint(checkpoint_dir(tmp_path) / "last.ckpt")
    module.configure_model()
    conv = next(layer for layer in module.network.modules() if isinstance(layer, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
