"""Reruns never collide: every fit is a new run folder beside the earlier ones, `--ckpt_path last` is the newest
run's last.ckpt, and a resumed fit continues its own run's folder and logs."""

import csv

import pytest
import torch
from conftest import quick_args, run_folder
from conftest import run_in_process as project


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same fit twice into one folder, the second resumed for one more epoch, then `test --ckpt_path last`."""
    root = tmp_path_factory.mktemp("runs")
    args = quick_args(root, "--trainer.max_epochs", "1")
    printed = {"first": project("fit", *args), "second": project("fit", *args)}
    first_weights = (run_folder(root, 0) / "checkpoints" / "last.ckpt").read_bytes()
    printed["resumed"] = project("fit", *args, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    printed["test"] = project("test", *args, "--ckpt_path", "last")
    return root, printed, first_weights


def test_the_same_command_twice_trains_twice_into_new_run_folders(runs):
    root, _, first_weights = runs
    for version in (0, 1):
        folder = run_folder(root, version)
        assert {"config.yaml", "hparams.yaml", "metrics.csv"} <= {path.name for path in folder.iterdir()}
        assert (folder / "checkpoints" / "last.ckpt").is_file()
    assert (run_folder(root, 0) / "checkpoints" / "epoch=0-step=20.ckpt").is_file()  # 1,258 samples, batch 64
    # Nothing of the first run was touched by the later ones.
    assert (run_folder(root, 0) / "checkpoints" / "last.ckpt").read_bytes() == first_weights


def test_fit_ckpt_path_last_resumes_the_newest_run_in_its_own_folder(runs):
    root, printed, _ = runs
    last = run_folder(root, 1) / "checkpoints" / "last.ckpt"
    assert f"[project] resuming from {last}" in printed["resumed"]
    assert torch.load(last, weights_only=True)["global_step"] == 40
    assert (run_folder(root, 1) / "checkpoints" / "epoch=1-step=40.ckpt").is_file()
    # Its logs continue the run's metrics.csv (epochs 0 and 1); its first config.yaml is kept beside this attempt's.
    with (run_folder(root, 1) / "metrics.csv").open(newline="") as file:
        epochs = {row["epoch"] for row in csv.DictReader(file) if row["val_acc"]}
    assert epochs == {"0", "1"}
    assert "max_epochs: 1\n" in (run_folder(root, 1) / "config.yaml").read_text()
    assert "max_epochs: 2\n" in (run_folder(root, 1) / "config.resume-1.yaml").read_text()


def test_test_ckpt_path_last_evaluates_the_newest_runs_checkpoint(runs):
    root, printed, _ = runs
    assert f"[project] loading {run_folder(root, 1) / 'checkpoints' / 'last.ckpt'}" in printed["test"]
    assert (run_folder(root, 2) / "test_metrics.json").is_file()  # the test command's own log folder
    assert not (run_folder(root, 2) / "checkpoints").exists()


def test_ckpt_path_last_without_a_run_to_resume_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        project("fit", *quick_args(tmp_path / "run", "--ckpt_path", "last"))
    assert exit_info.value.code == 2
    assert not (tmp_path / "run").exists()


def run_config(root, ckpt_path=None, dirpath=None):
    """A subcommand's parsed config, as far as the run-folder policy reads it: no parser needed."""
    from jsonargparse import Namespace

    logger = Namespace(
        class_path="project.runs.loggers.CSVLogger",
        init_args=Namespace(save_dir=None, name="lightning_logs", version=None),
    )
    trainer = Namespace(default_root_dir=str(root), logger=logger)
    return Namespace(trainer=trainer, checkpoint=Namespace(dirpath=dirpath), ckpt_path=ckpt_path)


def test_the_run_folder_policy_works_on_a_plain_config_without_a_parser(tmp_path):
    from project.runs.folders import RunFolderError, prepare_run

    config = run_config(tmp_path, "last")
    with pytest.raises(RunFolderError, match="no run with a last.ckpt"):
        prepare_run(config, "fit")
    for version in (0, 1):
        (tmp_path / "lightning_logs" / f"version_{version}" / "checkpoints").mkdir(parents=True)
    newest = tmp_path / "lightning_logs" / "version_1"
    (newest / "checkpoints" / "last.ckpt").write_bytes(b"")
    (newest / "config.yaml").write_text("")
    assert prepare_run(config, "fit") == "config.resume-1.yaml"  # the run's first config.yaml is kept
    assert config.ckpt_path == str(newest / "checkpoints" / "last.ckpt")
    assert config.trainer.logger.init_args.version == 1 and config.trainer.logger.init_args.save_dir == str(tmp_path)
    fixed = tmp_path / "fixed"
    (fixed / "last.ckpt").parent.mkdir()
    (fixed / "last.ckpt").write_bytes(b"")
    with pytest.raises(RunFolderError, match="already holds an earlier run's checkpoints"):
        prepare_run(run_config(tmp_path, dirpath=str(fixed)), "fit")
