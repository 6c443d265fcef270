import pytest
import torch
from helpers import REPO, last_checkpoint, metric_values, quick_args, run_folder, run_project
from lightning.pytorch import Trainer
from project.data import DigitsDataModule
from project.module import ClassificationModule
from project.networks import MLP
from torch import nn


def test_training_step_returns_cross_entropy_and_tracks_accuracy():
    torch.manual_seed(0)
    module = ClassificationModule(MLP(num_classes=3, input_shape=(4,), hidden_sizes=()), num_classes=3)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    loss = module.training_step([x, y], 0)
    logits = module(x)
    assert torch.allclose(loss, nn.functional.cross_entropy(logits, y))
    expected_accuracy = (logits.argmax(1) == y).float().mean()
    module.updates["train"].flush()  # what on_train_epoch_end does first
    logged = module.metrics["train_metrics"].compute()["train_acc"]  # what on_train_epoch_end logs
    assert torch.isclose(logged, expected_accuracy)


def test_train_metrics_are_exact_per_sample_means_over_uneven_batches():
    module = ClassificationModule(nn.Flatten(), num_classes=2)
    batches = [  # logits are the inputs: 3 samples all correct, then 1 wrong
        [torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]]), torch.tensor([0, 1, 0])],
        [torch.tensor([[5.0, 0.0]]), torch.tensor([1])],
    ]
    losses = [module.training_step(batch, index) for index, batch in enumerate(batches)]
    module.updates["train"].flush()
    assert module.metrics["train_metrics"].compute()["train_acc"].item() == 0.75
    assert torch.isclose(module.losses["train_loss"].compute(), (3 * losses[0] + losses[1]) / 4)


def test_eval_metrics_are_exact_per_sample_means_over_uneven_batches():
    module = ClassificationModule(nn.Flatten(), num_classes=2, label_smoothing=0.0)
    # Logits are the inputs: batch 1 (3 samples) all correct, batch 2 (1 sample) wrong.
    batches = [
        [torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]]), torch.tensor([0, 1, 0])],
        [torch.tensor([[5.0, 0.0]]), torch.tensor([1])],
    ]
    for batch in batches:
        module.test_step(batch, 0)
    module.updates["test"].flush()
    assert module.metrics["test_metrics"].compute()["test_acc"].item() == 0.75
    losses = torch.cat([nn.functional.cross_entropy(x, y, reduction="none") for x, y in batches])
    assert torch.isclose(module.losses["test_loss"].compute(), losses.mean())


def test_optimizer_and_scheduler_come_from_the_injected_callables():
    module = ClassificationModule(
        MLP(num_classes=2, input_shape=(3,)),
        num_classes=2,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9, nesterov=True),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1),
    )
    config = module.configure_optimizers()
    assert config["optimizer"].defaults["lr"] == 0.5 and config["optimizer"].defaults["nesterov"]
    assert isinstance(config["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.StepLR)
    assert config["lr_scheduler"]["interval"] == "step"  # the default: stepped after every optimizer step


@pytest.mark.slow
def test_train_acc_counts_every_sample_of_every_rank_once(tmp_path):
    """With lr 0 the weights never change: the epoch's train_acc on 2 ranks must be the accuracy of the saved weights
    on the whole training split (1,258 samples, 629 a rank), counted across ranks."""
    flags = ("--trainer.devices", "2", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0")
    flags += ("--model.optimizer.init_args.lr", "0", "--model.scheduler", "null")
    result = run_project("fit", *quick_args(tmp_path, *flags), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    [logged] = metric_values(run_folder(tmp_path), "train_acc")
    module = ClassificationModule.load_from_checkpoint(last_checkpoint(tmp_path))
    data = DigitsDataModule()
    data.setup("fit")
    x, y = (torch.stack(column) for column in zip(*data.splits["train"], strict=True))
    with torch.no_grad():
        expected = (module(x).argmax(dim=1) == y).float().mean().item()
    assert len(y) == 1258 and logged == pytest.approx(expected, abs=1e-6)


def test_a_metric_added_to_stage_metrics_is_logged_for_every_stage_beside_the_exact_loss_and_accuracy(monkeypatch):
    """One line in ``stage_metrics`` gives ``train_/val_/test_`` versions of a metric; the loss and accuracy stay exact
    per-sample means over uneven batches (3 samples then 1)."""
    import project.module
    from torchmetrics.classification import MulticlassF1Score

    declared = project.module.stage_metrics

    def with_f1(num_classes: int):
        metrics = declared(num_classes)
        metrics.add_metrics({"f1": MulticlassF1Score(num_classes, average="macro", validate_args=False)})
        return metrics

    monkeypatch.setattr(project.module, "stage_metrics", with_f1)
    module = ClassificationModule(nn.Flatten(), num_classes=2)
    x = torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0], [5.0, 0.0]])  # logits are the inputs: the last one wrong
    y = torch.tensor([0, 1, 0, 1])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=3)
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
    [metrics] = trainer.test(module, loader, verbose=False)
    assert set(metrics) == {"test_loss", "test_acc", "test_f1"}
    assert metrics["test_acc"] == 0.75 and metrics["test_f1"] == pytest.approx((0.8 + 2 / 3) / 2)  # F1 0.8 and 2/3
    assert metrics["test_loss"] == pytest.approx(nn.functional.cross_entropy(x, y).item())
    assert set(module.metrics["train_metrics"].keys()) == {"train_acc", "train_f1"}


def test_the_module_shards_its_network_only_through_a_strategy_that_says_it_can():
    from project.module import ShardsNetworks

    from trainfleet.runtime.sharding import FSDP2Strategy
    from trainfleet.runtime.strategy import DDPStrategy

    assert issubclass(FSDP2Strategy, ShardsNetworks) and not issubclass(DDPStrategy, ShardsNetworks)
