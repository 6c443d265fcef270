"""One process trains without the DDP wrapper, to the same weights as Lightning's DDPStrategy.

In-process (one process: Lightning launches nothing); the multi-process path is Lightning's own and is what
tests/test_gradient_sync.py and tests/test_end_to_end.py run.
"""

import sys

import pytest
import torch
import torch.distributed as dist
from helpers import assert_same_weights, last_weights, quick_args
from lightning.pytorch import Callback, LightningModule, Trainer

from trainfleet.main import main

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds


class RecordsSetup(Callback):
    """Seen from inside fit: what does the strategy train, and which strategy is it?"""

    seen: dict = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        RecordsSetup.seen = {
            "wrapped": trainer.strategy.model is not pl_module,
            "strategy": type(trainer.strategy).__module__,
        }


def _fit(run_dir, *flags: str) -> tuple[dict, dict[str, torch.Tensor]]:
    record = "--trainer.callbacks+=test_strategy.RecordsSetup"
    main(["fit", *quick_args(run_dir, "--trainer.max_epochs", "2", record, *flags)])
    return RecordsSetup.seen, last_weights(run_dir)


@pytest.fixture(autouse=True)
def bare_argv_and_no_leftover_group(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["project"])
    yield
    if dist.is_initialized():  # Lightning's DDPStrategy leaves its process group behind
        dist.destroy_process_group()


def test_one_process_skips_ddp_and_matches_lightnings_ddp_strategy_bit_for_bit(tmp_path):
    ours, our_weights = _fit(tmp_path / "ours")
    assert ours == {"wrapped": False, "strategy": "trainfleet.runtime.strategy"}

    lightnings_flags = ("--trainer.strategy.class_path", "lightning.pytorch.strategies.DDPStrategy")
    theirs, their_weights = _fit(tmp_path / "lightning", *lightnings_flags)
    assert theirs == {"wrapped": True, "strategy": "lightning.pytorch.strategies.ddp"}
    assert_same_weights(our_weights, their_weights)
