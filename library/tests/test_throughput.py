"""What a run reports of its speed (samples/s, model TFLOP/s, MFU where the GPU's peak is known), and in-memory data
kept on the training device."""

import pytest
import torch
from helpers import metrics_rows, quick_args, run_folder, run_in_process
from lightning.pytorch import Trainer
from project.data import DigitsDataModule
from project.module import ClassificationModule
from project.networks import MLP

from trainfleet.data.loaders import TensorBatchLoader
from trainfleet.runtime.throughput import flops_per_sample

# The digits MLP (64 -> 128 -> 64 -> 10): 2 FLOPs per multiply-add forward, twice that backward, except the input
# gradient of the first layer, which nothing needs.
LAYERS = 64 * 128 + 128 * 64 + 64 * 10
MLP_FLOPS = 3 * 2 * LAYERS - 2 * 64 * 128


def logged(root) -> list[dict[str, str]]:
    return [row for row in metrics_rows(run_folder(root)) if row["samples_per_sec"]]


def test_flops_are_counted_on_meta_tensors_without_drawing_random_numbers():
    network = MLP(input_shape=(64,), num_classes=10, dropout=0.3)
    state = torch.get_rng_state()
    assert flops_per_sample(network, torch.zeros(32, 64)) == MLP_FLOPS
    assert torch.equal(torch.get_rng_state(), state)  # dropout ran on meta tensors: exact resume is unaffected
    assert all(p.grad is None for p in network.parameters())


@pytest.mark.slow
def test_a_fit_logs_model_tflops_with_samples_per_second_and_no_mfu_on_cpu(tmp_path):
    printed = run_in_process("fit", *quick_args(tmp_path, "--trainer.max_epochs", "2"))
    assert f"model FLOPs (forward and backward): {MLP_FLOPS:.3g} per sample, {MLP_FLOPS * 64:.3g} per step" in printed
    rows = logged(tmp_path)
    assert rows and "mfu" not in rows[0]
    for row in rows:
        assert float(row["tflops_per_sec"]) == pytest.approx(float(row["samples_per_sec"]) * MLP_FLOPS / 1e12)


@pytest.mark.slow
def test_mfu_is_the_model_flops_rate_per_device_over_its_peak(tmp_path, monkeypatch):
    # a GPU Lightning knows, pretended
    monkeypatch.setattr("trainfleet.runtime.throughput.peak_flops", lambda trainer: 2e9)
    run_in_process("fit", *quick_args(tmp_path, "--trainer.max_epochs", "2"))
    for row in logged(tmp_path):
        assert float(row["mfu"]) == pytest.approx(float(row["tflops_per_sec"]) * 1e12 / 2e9)


def test_in_memory_batches_come_from_tensors_on_the_given_device():
    data = DigitsDataModule(batch_size=100)
    data.setup("fit")
    assert data._gpu() is None  # no Trainer, or a CPU one: the tensors stay where they are
    plain = list(data.train_dataloader())
    tensors, sampler = data.splits["train"].tensors, data.train_dataloader().sampler
    on_device = list(TensorBatchLoader(tensors, sampler, 100, device=torch.device("cpu")))
    assert len(plain) == len(on_device) == 13  # ceil(1258 / 100)
    for batch, other in zip(plain, on_device, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(batch, other, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_in_memory_splits_live_on_the_device():
    data = DigitsDataModule()
    module = ClassificationModule(MLP(input_shape=data.input_shape, num_classes=10), num_classes=10)
    trainer = Trainer(accelerator="gpu", devices=1, max_steps=5, logger=False, enable_checkpointing=False)
    trainer.fit(module, datamodule=data)
    assert trainer.train_dataloader.tensors[0].device.type == "cuda"
    off = DigitsDataModule(on_device=False)
    off.trainer = trainer
    off.setup("fit")
    assert off.train_dataloader().tensors[0].device.type == "cpu"
