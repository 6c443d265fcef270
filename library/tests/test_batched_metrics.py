import torch
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from trainfleet import batched_metrics
from trainfleet.batched_metrics import BatchedUpdates


def metrics() -> tuple[MeanMetric, MetricCollection]:
    return MeanMetric(nan_strategy="disable"), MetricCollection({"acc": MulticlassAccuracy(5, average="micro")})


def test_batched_updates_give_the_per_step_updates_figures_and_hold_at_most_their_limit(monkeypatch):
    monkeypatch.setattr(batched_metrics, "MAX_HELD_ELEMENTS", 7 * 5 * 3)  # a flush every third batch of 7
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n, 5, generator=generator), torch.randint(5, (n,), generator=generator)) for n in [7] * 10]
    batches.append((torch.randn(2, 5, generator=generator), torch.randint(5, (2,), generator=generator)))
    per_step_loss, per_step = metrics()
    batched = BatchedUpdates(*metrics())
    held = []
    for logits, labels in batches:
        loss = torch.nn.functional.cross_entropy(logits, labels)
        per_step_loss.update(loss.expand(len(labels)))
        per_step.update(logits, labels)
        batched.add(loss, logits, labels)
        held.append(len(batched.held))
    assert held == [1, 2, 0] * 3 + [1, 2]  # flushed at the limit
    assert batched.metrics["acc"].update_count == 3  # three calls for nine batches
    batched.flush()
    assert batched.held == [] and batched.metrics["acc"].update_count == 4
    assert batched.metrics.compute()["acc"] == per_step.compute()["acc"]  # the same counts
    assert torch.isclose(batched.loss.compute(), per_step_loss.compute())


def test_a_flush_with_nothing_held_leaves_the_metrics_untouched():
    batched = BatchedUpdates(*metrics())
    batched.flush()
    assert batched.metrics["acc"].update_count == 0 and batched.loss.update_count == 0


def test_logits_that_are_a_view_count_their_whole_storage(monkeypatch):
    monkeypatch.setattr(batched_metrics, "MAX_HELD_ELEMENTS", 100)
    batched = BatchedUpdates(*metrics())
    output = torch.randn(4, 10, 5)  # a network's output of 200 elements, of which the logits are a slice
    logits, labels = output[:, -1], torch.tensor([0, 1, 2, 3])
    batched.add(torch.tensor(1.0), logits, labels)
    assert batched.held == []  # 20 logits, but holding them would keep 200 elements alive: updated at once
