"""FSDP2 (configs/fsdp.yaml) on CPU with gloo: every rank holds half of each weight, checkpoints are sharded folders
written atomically in the background, and everything the DDP path promises holds: exact evaluation on any number of
processes, exact resume after SIGKILL and SIGTERM, the NaN guard, checkpoints that load with or without the overlay."""

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import (
    REPO,
    assert_same_weights,
    free_port,
    last_checkpoint,
    project_env,
    quick_args,
    run_folder,
    run_project,
)
from test_faults import RESUMABLE, fail_at, fit

from trainfleet.checkpoints.files import load_sharded_as_full, recover_interrupted_save
from trainfleet.exit_codes import CRASHED_EXIT_CODE

FSDP = ("--config", str(REPO / "configs" / "fsdp.yaml"))
# The learning rate's cosine set for 20 epochs: over the runs' own two it would anneal before the model has learnt
# what the tests check (test accuracy above chance).
TRAINED = (*RESUMABLE, "--model.scheduler.init_args.total_steps", "200")


def full(path: Path) -> dict:
    """A checkpoint as one dict: a sharded folder gathered, a file loaded."""
    return load_sharded_as_full(path) if path.is_dir() else torch.load(path, weights_only=True)


def metrics_of(run_dir: Path, *args: str) -> dict:
    result = run_project("test", *quick_args(run_dir, *args), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((run_folder(run_dir) / "test_metrics.json").read_text())


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """Two epochs on 2 processes under FSDP2 (dropout on: RNG states matter)."""
    run_dir = tmp_path_factory.mktemp("fsdp")
    result, _ = fit(run_dir, *FSDP, *TRAINED)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_each_rank_holds_half_of_every_weight_in_a_sharded_checkpoint(sharded):
    from torch.distributed.checkpoint import FileSystemReader

    checkpoint = last_checkpoint(sharded)
    assert sorted(path.name for path in checkpoint.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.pt",
    ]
    tensors = FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    weight = tensors["state_dict.network.layers.1.weight"]  # the first Linear: 64 inputs, 128 outputs
    assert tuple(weight.size) == (128, 64)
    assert [tuple(chunk.sizes) for chunk in weight.chunks] == [(64, 64), (64, 64)]  # one half per rank
    momentum = tensors["optimizer_0.state.network.layers.1.weight.momentum_buffer"]
    assert [tuple(chunk.sizes) for chunk in momentum.chunks] == [(64, 64), (64, 64)]  # the optimizer state too
    assert full(checkpoint)["global_step"] == 20


@pytest.mark.slow
def test_fsdp2_trains_to_the_weights_ddp_trains_to(sharded, tmp_path):
    result, _ = fit(tmp_path, *TRAINED)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(full(last_checkpoint(sharded))["state_dict"], full(last_checkpoint(tmp_path))["state_dict"])


@pytest.mark.slow
def test_its_checkpoint_tests_the_same_on_1_2_and_3_processes_with_or_without_fsdp_and_consolidated(sharded, tmp_path):
    checkpoint = str(last_checkpoint(sharded))
    two = metrics_of(tmp_path / "2", *FSDP, "--trainer.devices", "2", "--ckpt_path", checkpoint)
    three = metrics_of(tmp_path / "3", *FSDP, "--trainer.devices", "3", "--ckpt_path", checkpoint)
    one_plain = metrics_of(tmp_path / "1", "--ckpt_path", checkpoint)
    consolidated = tmp_path / "consolidated.ckpt"
    done = run_project("consolidate", checkpoint, str(consolidated), cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    from_file = metrics_of(tmp_path / "file", "--ckpt_path", str(consolidated))
    assert two["test_acc"] == three["test_acc"] == one_plain["test_acc"] == from_file["test_acc"] > 0.5
    assert two["test_loss"] == pytest.approx(one_plain["test_loss"], rel=1e-6)
    assert_same_weights(torch.load(consolidated, weights_only=True)["state_dict"], full(Path(checkpoint))["state_dict"])


@pytest.mark.slow
def test_predictions_on_2_sharded_processes_are_those_of_1_plain_one(sharded, tmp_path):
    checkpoint = str(last_checkpoint(sharded))
    for name, flags in (("fsdp", (*FSDP, "--trainer.devices", "2")), ("plain", ())):
        result = run_project("predict", *quick_args(tmp_path / name, *flags, "--ckpt_path", checkpoint), cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
    fsdp, plain = (
        list(csv.reader((run_folder(tmp_path / name) / "predictions.csv").open())) for name in ("fsdp", "plain")
    )
    assert [row[:2] for row in fsdp] == [row[:2] for row in plain] and len(fsdp) == 1 + 359  # inputs, predictions
    assert [float(p) for row in fsdp[1:] for p in row[2:]] == pytest.approx(
        [float(p) for row in plain[1:] for p in row[2:]], abs=1e-6
    )


@pytest.mark.slow
def test_a_killed_sharded_run_resumes_mid_epoch_to_the_same_weights(sharded, tmp_path):
    """Checkpoints every 4 steps, written in the background; SIGKILL at step 14 on every rank: the newest complete
    checkpoint (sharded optimizer state included) resumes to the uninterrupted run's weights."""
    every_4 = ("--checkpoint.every_n_train_steps", "4")
    killed, _ = fit(tmp_path, *FSDP, *TRAINED, *every_4, *fail_at(14, -1, "sigkill"))
    assert killed.returncode == -9
    assert full(last_checkpoint(tmp_path))["global_step"] in (8, 12)  # 12 if its background write finished
    resumed, _ = fit(tmp_path, *FSDP, *TRAINED, *every_4, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(full(last_checkpoint(tmp_path))["state_dict"], full(last_checkpoint(sharded))["state_dict"])


@pytest.mark.slow
def test_sigterm_stops_every_sharded_rank_at_one_step_saves_it_and_auto_resumes_exactly(sharded, tmp_path):
    check_every_4 = ("--preemption.check_every_n_steps", "4")
    stopped, _ = fit(tmp_path, *FSDP, *TRAINED, *check_every_4, *fail_at(13, 1, "sigterm"))
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert stopped.stderr.count("SIGTERM on rank 1: stopped at step 16") == 2
    assert full(last_checkpoint(tmp_path))["global_step"] == 16  # the stop waited for its background save
    resumed, _ = fit(tmp_path, *FSDP, *TRAINED, "--ckpt_path", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(full(last_checkpoint(tmp_path))["state_dict"], full(last_checkpoint(sharded))["state_dict"])


@pytest.mark.slow
def test_a_sharded_run_resumes_on_3_processes(tmp_path):
    """DCP reshards on load: weights and optimizer state are exact at the resume; the order of the samples after it
    is a 3-process run's (steps per epoch, shards), not the 2-process run's."""
    first, _ = fit(tmp_path, *FSDP, "--trainer.max_epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    more = ("--trainer.devices", "3", "--trainer.max_epochs", "2", "--ckpt_path", "last")
    result = run_project("fit", *quick_args(tmp_path, *FSDP, *more), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RNG states not restored: saved by 2 ranks, resumed on 3" in result.stderr
    assert full(last_checkpoint(tmp_path))["global_step"] == 10 + 7  # ceil(ceil(1258 / 3) / 64) steps in epoch 2


@pytest.mark.slow
def test_a_nan_loss_stops_a_sharded_run_and_no_checkpoint_holds_it(tmp_path):
    result, _ = fit(tmp_path, *FSDP, "--model.optimizer.init_args.lr", "1000", "--trainer.max_epochs", "3")
    assert result.returncode != 0
    assert "the training loss became NaN or inf at step" in result.stderr
    checkpoint = full(last_checkpoint(tmp_path))
    assert all(value.isfinite().all() for value in checkpoint["state_dict"].values())


@pytest.mark.slow
def test_bf16_mixed_precision_trains_sharded_on_cpu(tmp_path):
    result, _ = fit(tmp_path, *FSDP, "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert full(last_checkpoint(tmp_path))["global_step"] == 30


def refused(run_dir: Path, *args: str) -> str:
    result = run_project(*args, cwd=REPO)
    assert result.returncode == 2, result.stderr[-3000:]
    assert not (run_dir / "lightning_logs").exists() or not any((run_dir / "lightning_logs").iterdir())
    return result.stderr


@pytest.mark.slow
def test_bad_sharding_input_is_refused_before_training(sharded, tmp_path):
    not_a_module = ("--trainer.strategy.init_args.shard_classes", "[torch.optim.SGD]")
    assert "torch.optim.SGD is not a torch.nn.Module class" in refused(
        tmp_path / "a", "fit", *quick_args(tmp_path / "a", *FSDP, *not_a_module, "--trainer.devices", "2")
    )
    broken = tmp_path / "broken.ckpt"
    shutil.copytree(last_checkpoint(sharded), broken)
    (broken / "__1_0.distcp").unlink()
    assert "shard __1_0.distcp is missing" in refused(
        tmp_path / "b", "fit", *quick_args(tmp_path / "b", *FSDP, "--trainer.devices", "2", "--ckpt_path", str(broken))
    )
    assert "shard __1_0.distcp is missing" in refused(tmp_path / "c", "consolidate", str(broken), str(tmp_path / "x"))
    other = ("--model.network.init_args.hidden_sizes", "[32]", "--ckpt_path", str(last_checkpoint(sharded)))
    assert "another network's weights" in refused(tmp_path / "d", "test", *quick_args(tmp_path / "d", *other))


def test_a_save_killed_between_its_renames_leaves_a_whole_checkpoint(tmp_path):
    """The shards go to .last.ckpt.partial; once every rank has written, last.ckpt moves to .last.ckpt.old and the
    new folder into its place. Killed before the renames, last.ckpt is the previous one; between them, the complete
    new one is put in place when a run looks for it."""
    last, partial, old = (tmp_path / name for name in ("last.ckpt", ".last.ckpt.partial", ".last.ckpt.old"))
    for folder, step in ((old, "1"), (partial, "2")):
        folder.mkdir()
        (folder / ".metadata").write_text(step)
        (folder / "meta.pt").write_text(step)
    recover_interrupted_save(last)
    assert (last / ".metadata").read_text() == "2" and not partial.exists()
    old.mkdir()  # killed between the renames with no complete new folder: the previous one is put back
    (old / ".metadata").write_text("1")
    shutil.rmtree(last)
    recover_interrupted_save(last)
    assert (last / ".metadata").read_text() == "1"


@pytest.mark.slow
def test_a_sharded_run_across_nodes_names_a_node_that_never_comes_within_the_start_up_timeout(tmp_path):
    """FSDP2's ranks meet as DDP's do (runtime/rendezvous.py), not in torch's rendezvous for 30 minutes."""
    startup = ("--trainer.num_nodes", "2", "--trainer.strategy.init_args.startup_timeout", "0:00:05")
    env = project_env(NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    result = run_project("fit", *quick_args(tmp_path / "run", *FSDP, *startup), cwd=REPO, env=env, timeout=120)
    assert result.returncode == CRASHED_EXIT_CODE, result.stderr[-3000:]
    assert "node rank 1 (rank 1 of 2 missing) never joined the rendezvous" in result.stderr
    assert not (tmp_path / "run").exists()
