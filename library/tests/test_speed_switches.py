"""The speed switches on CPU, for real: torch.compile (dynamo and AOTAutograd), bf16-mixed and channels_last each
reach the accuracy target, and a compiled run's checkpoint loads and evaluates in an uncompiled module."""

import json

import pytest
import torch
from helpers import checkpoint_dir, quick_args, run_folder, run_in_process
from lightning.pytorch import Trainer
from project.data import DigitsDataModule
from project.module import ClassificationModule

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds


def fit_and_test(root, *flags: str) -> float:
    args = quick_args(root, *flags)
    run_in_process("fit", *args)
    run_in_process("test", *args, "--ckpt_path", "last")
    return json.loads((run_folder(root) / "test_metrics.json").read_text())["test_acc"]


# The template's part of compiling is dynamo's capture and AOTAutograd's graphs, in place (checkpoint keys); inductor's
# C++ code generation is torch's own and costs a minute on a fresh machine's CPU (no compile cache): aot_eager skips it.
# Validation off (eval mode is another graph), and whole batches only (a smaller last batch is a dynamic-shape graph).
COMPILED = ("--model.compile", "{backend: aot_eager}", "--trainer.limit_val_batches", "0")
COMPILED += ("--trainer.limit_train_batches", "19")


def test_a_compiled_network_trains_and_its_checkpoint_evaluates_in_an_uncompiled_module(tmp_path):
    run_in_process("fit", *quick_args(tmp_path, *COMPILED))
    ckpt = checkpoint_dir(tmp_path) / "last.ckpt"
    assert not any("_orig_mod" in key for key in torch.load(ckpt, weights_only=True)["state_dict"])
    uncompiled = ClassificationModule.load_from_checkpoint(ckpt, compile=False)
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    [metrics] = trainer.test(uncompiled, DigitsDataModule(), verbose=False)
    assert metrics["test_acc"] >= 0.90


def test_bf16_mixed_precision_reaches_the_target(tmp_path):
    assert fit_and_test(tmp_path, "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "10") >= 0.90


def test_channels_last_cnn_reaches_the_target_and_keeps_its_layout(tmp_path):
    cnn = ("--model.network", "project.networks.SmallCNN", "--model.network.init_args.channels", "[16, 32]")
    accuracy = fit_and_test(tmp_path, *cnn, "--trainer.max_epochs", "10", "--model.channels_last", "true")
    assert accuracy >= 0.90
    module = ClassificationModule.load_from_checkpoint(checkpoint_dir(tmp_path) / "last.ckpt")
    module.configure_model()
    conv = next(layer for layer in module.network.modules() if isinstance(layer, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
