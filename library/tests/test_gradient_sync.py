"""DDP averages gradients: 2 ranks with batch B must train exactly like 1 rank with batch 2B."""

import pytest
import torch
from helpers import REPO, last_checkpoint, quick_args, run_project
from lightning.pytorch import seed_everything
from project.networks import MLP

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds

STEPS, BATCH = 8, 16


def _fit_weights(run_dir, devices: int, batch_size: int) -> dict[str, torch.Tensor]:
    args = quick_args(
        run_dir,
        *("--trainer.devices", str(devices), "--data.init_args.batch_size", str(batch_size)),
        # Unshuffled, so rank r's batch k is samples 2Bk + r, 2Bk + r + 2, ...: together, 1-rank batch k.
        *("--data.init_args.shuffle", "false", "--trainer.max_epochs", "1"),
        *("--trainer.limit_train_batches", str(STEPS), "--trainer.limit_val_batches", "0"),
    )
    result = run_project("fit", *args, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = torch.load(last_checkpoint(run_dir), weights_only=True)
    assert ckpt["global_step"] == STEPS
    return ckpt["state_dict"]


def test_two_ranks_of_batch_b_match_one_rank_of_batch_2b(tmp_path):
    two_ranks = _fit_weights(tmp_path / "two", devices=2, batch_size=BATCH)
    one_rank = _fit_weights(tmp_path / "one", devices=1, batch_size=2 * BATCH)
    assert two_ranks.keys() == one_rank.keys()
    for name in two_ranks:
        torch.testing.assert_close(two_ranks[name], one_rank[name], atol=1e-5, rtol=0, msg=name)
    # The comparison is meaningful only if training moved the weights well beyond the tolerance.
    seed_everything(42)  # the config's seed: the CLI builds the network right after seeding
    initial = MLP(num_classes=10, input_shape=(1, 8, 8), hidden_sizes=(128, 64)).state_dict()
    moved = max((two_ranks[f"network.{k}"] - v).abs().max().item() for k, v in initial.items())
    assert moved > 1e-2
