import torch
from torch import nn

from project.module import ClassificationModule
from project.networks import MLP


def test_training_step_returns_cross_entropy_and_tracks_accuracy():
    torch.manual_seed(0)
    module = ClassificationModule(MLP(num_classes=3, input_shape=(4,), hidden_sizes=()), num_classes=3)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    loss = module.training_step([x, y], 0)
    logits = module(x)
    assert torch.allclose(loss, nn.functional.cross_entropy(logits, y))
    expected_accuracy = (logits.argmax(1) == y).float().mean()
    module.update_train_acc()  # done by on_train_epoch_end
    assert torch.isclose(module.train_acc.compute(), expected_accuracy)


def test_eval_metrics_are_exact_per_sample_means_over_uneven_batches():
    module = ClassificationModule(nn.Flatten(), num_classes=2, label_smoothing=0.0)
    # Logits are the inputs: batch 1 (3 samples) all correct, batch 2 (1 sample) wrong.
    batches = [
        [torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]]), torch.tensor([0, 1, 0])],
        [torch.tensor([[5.0, 0.0]]), torch.tensor([1])],
    ]
    for batch in batches:
        module._evaluate(batch, "test")
    assert module.test_acc.compute().item() == 0.75
    losses = torch.cat([nn.functional.cross_entropy(x, y, reduction="none") for x, y in batches])
    assert torch.isclose(module.test_loss.compute(), losses.mean())


def test_optimizer_and_scheduler_come_from_the_injected_callables():
    module = ClassificationModule(
        MLP(num_classes=2, input_shape=(3,)),
        num_classes=2,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9, nesterov=True),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1),
    )
    config = module.configure_optimizers()
    assert config["optimizer"].defaults["lr"] == 0.5 and config["optimizer"].defaults["nesterov"]
    assert isinstance(config["lr_scheduler"], torch.optim.lr_scheduler.StepLR)
