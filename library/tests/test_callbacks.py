"""The user's callbacks (project/callbacks.py): GradientNorm logs the gradients' norm every log_every_n_steps."""

import copy

import pytest
import torch
from helpers import REPO, metric_values, metrics_rows, quick_args, run_folder, run_in_process
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger
from project.callbacks import GradientNorm, total_norm
from project.module import ClassificationModule
from project.networks import MLP
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def test_total_norm_is_the_l2_norm_of_every_gradient_together():
    network = nn.Linear(2, 2)
    network.weight.grad = torch.tensor([[3.0, 0.0], [0.0, 0.0]])
    network.bias.grad = torch.tensor([4.0, 0.0])
    assert total_norm(network).item() == 5.0
    assert total_norm(nn.Linear(2, 2)).item() == 0.0  # no gradient yet


def test_gradient_norm_is_logged_every_log_every_n_steps_with_the_first_steps_exact_norm(tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    module = ClassificationModule(MLP(num_classes=3, input_shape=(4,), hidden_sizes=(8,)), num_classes=3)
    untrained = copy.deepcopy(module)
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        log_every_n_steps=3,
        callbacks=[GradientNorm()],
        logger=CSVLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=4))  # 10 steps, not shuffled
    logged = metric_values(run_folder(tmp_path, 0), "grad_norm")
    assert len(logged) == 3  # the 3rd, 6th and 9th steps
    optimizer = untrained.configure_optimizers()  # the module's own: SGD with torch's defaults
    for step in range(3):  # the same 3 steps by hand
        optimizer.zero_grad()
        untrained.loss_fn(untrained(x[4 * step : 4 * step + 4]), y[4 * step : 4 * step + 4]).backward()
        expected = total_norm(untrained).item()
        optimizer.step()
    assert logged[0] == pytest.approx(expected, rel=1e-6)
    assert len(set(logged)) == 3  # each a different step's gradients


@pytest.mark.slow
def test_the_overlay_lists_it_under_trainer_callbacks_and_a_cli_run_logs_grad_norm(tmp_path):
    overlay = ("--config", str(REPO / "configs" / "grad_norm.yaml"), "--trainer.log_every_n_steps", "3")
    short = ("--trainer.max_epochs", "1", "--trainer.limit_train_batches", "7", "--trainer.limit_val_batches", "0")
    run_in_process("fit", *quick_args(tmp_path, *overlay, *short))
    rows = [row for row in metrics_rows(run_folder(tmp_path)) if row["grad_norm"]]
    assert [int(row["step"]) for row in rows] == [2, 5] and all(float(row["grad_norm"]) > 0 for row in rows)
