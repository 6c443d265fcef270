"""Reruns never collide: every fit is a new run folder beside the earlier ones, `--ckpt_path last` is the newest
run's last.ckpt, and a resumed fit continues its own run's folder and logs."""

import pytest
import torch
from helpers import metrics_rows, quick_args, run_folder
from helpers import run_in_process as project


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


@pytest.mark.slow
def test_the_same_command_twice_trains_twice_into_new_run_folders(runs):
    root, _, first_weights = runs
    for version in (0, 1):
        folder = run_folder(root, version)
        assert {"config.yaml", "hparams.yaml", "metrics.csv"} <= {path.name for path in folder.iterdir()}
        assert (folder / "checkpoints" / "last.ckpt").is_file()
    assert (run_folder(root, 0) / "checkpoints" / "epoch=0-step=20.ckpt").is_file()  # 1,258 samples, batch 64
    # Nothing of the first run was touched by the later ones.
    assert (run_folder(root, 0) / "checkpoints" / "last.ckpt").read_bytes() == first_weights


@pytest.mark.slow
def test_fit_ckpt_path_last_resumes_the_newest_run_in_its_own_folder(runs):
    root, printed, _ = runs
    last = run_folder(root, 1) / "checkpoints" / "last.ckpt"
    assert f"[project] resuming from {last}" in printed["resumed"]
    assert torch.load(last, weights_only=True)["global_step"] == 40
    assert (run_folder(root, 1) / "checkpoints" / "epoch=1-step=40.ckpt").is_file()
    # Its logs continue the run's metrics.csv (epochs 0 and 1); its first config.yaml is kept beside this attempt's.
    epochs = {row["epoch"] for row in metrics_rows(run_folder(root, 1)) if row["val_acc"]}
    assert epochs == {"0", "1"}
    assert "max_epochs: 1\n" in (run_folder(root, 1) / "config.yaml").read_text()
    assert "max_epochs: 2\n" in (run_folder(root, 1) / "config.resume-1.yaml").read_text()


@pytest.mark.slow
def test_test_ckpt_path_last_evaluates_the_newest_runs_checkpoint(runs):
    root, printed, _ = runs
    assert f"[project] loading {run_folder(root, 1) / 'checkpoints' / 'last.ckpt'}" in printed["test"]
    assert (run_folder(root, 2) / "test_metrics.json").is_file()  # the test command's own log folder
    assert not (run_folder(root, 2) / "checkpoints").exists()


@pytest.mark.slow
def test_a_fit_without_a_logger_resumes_with_ckpt_path_last_to_the_uninterrupted_weights(tmp_path):
    """Without a logger the config is saved in default_root_dir, which every command shares: the resume's (and a
    test's) goes beside the first (Lightning's config saving refused them: config.yaml existed). Pitfall 12."""
    fixed = ("--trainer.logger", "false", "--model.scheduler.init_args.total_steps", "40")  # the schedule's length
    project("fit", *quick_args(tmp_path / "reference", *fixed, "--trainer.max_epochs", "2"))
    root = tmp_path / "run"
    project("fit", *quick_args(root, *fixed, "--trainer.max_epochs", "1"))
    project("fit", *quick_args(root, *fixed, "--trainer.max_epochs", "2", "--ckpt_path", "last"))
    expected = torch.load(tmp_path / "reference" / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == expected["global_step"] == 40
    assert all(torch.equal(resumed["state_dict"][key], value) for key, value in expected["state_dict"].items())
    assert "max_epochs: 1\n" in (root / "config.yaml").read_text()
    assert "max_epochs: 2\n" in (root / "config.resume-1.yaml").read_text()
    assert "test_acc" in project("test", *quick_args(root, *fixed, "--ckpt_path", "last"))  # its config beside too
    assert (root / "config.test-2.yaml").is_file()


def test_ckpt_path_last_without_a_run_to_resume_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        project("fit", *quick_args(tmp_path / "run", "--ckpt_path", "last"))
    assert exit_info.value.code == 2
    assert not (tmp_path / "run").exists()


def run_config(root, ckpt_path=None, dirpath=None):
    """A subcommand's parsed config, as far as the run-folder policy reads it: no parser needed."""
    from jsonargparse import Namespace

    logger = Namespace(
        class_path="trainfleet.runs.loggers.CSVLogger",
        init_args=Namespace(save_dir=None, name="lightning_logs", version=None),
    )
    trainer = Namespace(default_root_dir=str(root), logger=logger)
    return Namespace(trainer=trainer, checkpoint=Namespace(dirpath=dirpath), ckpt_path=ckpt_path)


def test_the_run_folder_policy_works_on_a_plain_config_without_a_parser(tmp_path):
    from trainfleet.runs.folders import RunFolderError, prepare_run

    config = run_config(tmp_path, "last")
    with pytest.raises(RunFolderError, match="no run with a last.ckpt"):
        prepare_run(config, "fit")
    for version in (0, 1):
        (tmp_path / "lightning_logs" / f"version_{version}" / "checkpoints").mkdir(parents=True)
    newest = tmp_path / "lightning_logs" / "version_1"
    (newest / "checkpoints" / "last.ckpt").write_bytes(b"")
    (newest / "config.yaml").write_text("")
    plan = prepare_run(config, "fit")
    assert plan.config_filename == "config.resume-1.yaml" and plan.folder == newest  # its first config.yaml is kept
    assert config.ckpt_path == str(newest / "checkpoints" / "last.ckpt")
    assert config.trainer.logger.init_args.version == 1 and config.trainer.logger.init_args.save_dir == str(tmp_path)
    fixed = tmp_path / "fixed"
    (fixed / "last.ckpt").parent.mkdir()
    (fixed / "last.ckpt").write_bytes(b"")
    with pytest.raises(RunFolderError, match="already holds an earlier run's checkpoints"):
        prepare_run(run_config(tmp_path, dirpath=str(fixed)), "fit")


@pytest.mark.slow
def test_fits_that_start_at_the_same_moment_get_distinct_run_folders(tmp_path):
    """Lightning numbers a run one above the highest folder it lists, so two starts at once can pick the same number
    (#11418, won't fix); the template's logger claims the folder with mkdir, which only one process can win."""
    import multiprocessing

    from lightning.pytorch import loggers

    from trainfleet.runs.loggers import CSVLogger

    first, second = loggers.CSVLogger(tmp_path / "lightning"), loggers.CSVLogger(tmp_path / "lightning")
    assert first.version == second.version == 0  # what Lightning alone gives two runs that start together
    context = multiprocessing.get_context("fork")
    barrier, versions = context.Barrier(4), context.Queue()

    def start() -> None:
        barrier.wait()  # the four starts coincide
        versions.put(CSVLogger(tmp_path / "ours").version)

    processes = [context.Process(target=start) for _ in range(4)]
    for process in processes:
        process.start()
    claimed = sorted(versions.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    assert claimed == [0, 1, 2, 3]
    assert sorted(path.name for path in (tmp_path / "ours" / "lightning_logs").iterdir()) == [
        f"version_{n}" for n in range(4)
    ]


def test_a_requeued_slurm_job_continues_the_run_its_job_started(tmp_path, monkeypatch):
    from trainfleet.runs.folders import JOB_FILE, prepare_run

    runs = tmp_path / "lightning_logs"
    for version, job in enumerate(("76", "77", "78")):
        (runs / f"version_{version}" / "checkpoints").mkdir(parents=True)
        (runs / f"version_{version}" / JOB_FILE).write_text(job + "\n")
        (runs / f"version_{version}" / "checkpoints" / "last.ckpt").write_bytes(b"")
    for name, value in {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "project", "SLURM_JOB_ID": "77"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    config = run_config(tmp_path)
    plan = prepare_run(config, "fit")
    assert plan.folder == runs / "version_1" and config.ckpt_path == str(
        runs / "version_1" / "checkpoints" / "last.ckpt"
    )
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # the job's first start: a new run
    plan = prepare_run(run_config(tmp_path), "fit")
    assert plan.folder is None and plan.config_filename == "config.yaml"
