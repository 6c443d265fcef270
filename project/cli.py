"""The command line: LightningCLI with this project's wiring.

``python -m project {fit,validate,test,predict} --config configs/digits.yaml [--key value ...]``.
``python -m project doctor [...]`` reports the distributed setup instead (project/doctor.py).
Every config key is a constructor argument of the Trainer, the model, the data module or the
checkpoint callback; this file only links them together and guards the run folder.
"""

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from jsonargparse import Namespace
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from project import doctor, runs
from project.callbacks import PredictionsWriter, RunGuard, TestMetricsWriter
from project.checkpointing import AtomicCheckpointIO, CheckpointError, load_checkpoint_file
from project.data import BaseDataModule
from project.faults import report
from project.launcher import ForkLauncher
from project.module import ClassificationModule
from project.overhead import NoProfiler

# Names Trainer.fit/test/... resolve themselves instead of reading a file ("last", "best", "auto": see runs.py).
LIGHTNING_CKPT_ALIASES = ("hpc", "registry")
# Lightning's default Rich bar redraws up to 100 times a second, from a thread that competes with training for the
# GIL: measured in a terminal, that cost a small CPU step about 20%. Twice a second is as readable.
PROGRESS_BAR_REFRESHES_PER_SECOND = 2


class ProjectCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir")  # a list: see runs.py
        parser.add_lightning_class_args(RunGuard, "guard")  # fail-fast, NaN guard, RNG states, preemption, samples/s
        parser.set_defaults({"checkpoint.save_last": True})
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.network.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.network.init_args.input_shape", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Resolves ``--ckpt_path last|best|auto`` and refuses what cannot run, before anything is built or written.

        Runs before LightningCLI reads the checkpoint's hyperparameters, which would fail with a raw traceback.
        """
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        runs.default_save_dirs(config.trainer)
        if config.ckpt_path == "auto":
            self._resume_if_possible(config)
        elif config.ckpt_path in ("last", "best"):
            self._use_newest_run(config, subcommand == "fit")
        elif subcommand == "fit" and config.ckpt_path is None:
            self._start_new_run(config)
        if config.ckpt_path and config.ckpt_path not in LIGHTNING_CKPT_ALIASES:
            try:
                load_checkpoint_file(config.ckpt_path, mmap=True)  # mmap: reads the structure, not every tensor
            except CheckpointError as error:
                parser.error(str(error))

    def _use_newest_run(self, config: Namespace, continue_run: bool) -> None:
        which = config.ckpt_path
        try:
            found = runs.find_checkpoint(config, which)
        except ValueError as error:
            self.parser.error(str(error))
        if found is None:
            where = runs.fixed_checkpoint_folder(config) or runs.versions_folder(config.trainer)
            self.parser.error(f"--ckpt_path {which}: no run with a last.ckpt in {where}; start one with fit")
        config.ckpt_path, folder = str(found[0]), found[1]
        if continue_run and folder is not None:
            self.save_config_kwargs["config_filename"] = runs.continue_run(config, folder)
        rank_zero_only(report)(f"{'resuming from' if continue_run else 'loading'} {config.ckpt_path}")

    def _resume_if_possible(self, config: Namespace) -> None:
        """``fit --ckpt_path auto``, for jobs that restart themselves (torchrun ``--max-restarts``, Kubernetes): resume
        the newest run when it has a checkpoint, else start. A torchrun restart continues the newest run's folder
        even before its first checkpoint, so it never resumes an older run."""
        restarted, newest = runs.restart_count() > 0, runs.find_checkpoint(config, "last")
        folders = runs.run_folders(config) if runs.fixed_checkpoint_folder(config) is None else []
        if restarted and folders and (newest is None or newest[1] != folders[0]):
            self.save_config_kwargs["config_filename"] = runs.continue_run(config, folders[0])
            config.ckpt_path = None
            rank_zero_only(report)(
                f"--ckpt_path auto: restart {runs.restart_count()}, no checkpoint yet: starting over"
            )
        elif newest is not None:
            config.ckpt_path = "last"
            self._use_newest_run(config, continue_run=True)
        else:
            config.ckpt_path = None
            rank_zero_only(report)("--ckpt_path auto: no checkpoint to resume, starting a new run")
            self._start_new_run(config)

    def _start_new_run(self, config: Namespace) -> None:
        """A fresh fit gets its own run folder; where every run shares one, refuse to write over an earlier run."""
        root = Path(config.trainer.get("default_root_dir") or ".")
        # A requeued SLURM job: Lightning resumes from the hpc_ckpt_N.ckpt it saved in default_root_dir.
        if SLURMEnvironment.detect() and any(root.glob("hpc_ckpt_*.ckpt")):
            found = runs.find_checkpoint(config, "last")
            if found is not None and found[1] is not None:  # it continues its run's folder
                self.save_config_kwargs["config_filename"] = runs.continue_run(config, found[1])
            return
        fixed = runs.fixed_checkpoint_folder(config)
        if fixed is not None and any(fixed.glob("*.ckpt")):
            self.parser.error(
                f"the checkpoint folder already holds an earlier run's checkpoints ({fixed}); resume with"
                " --ckpt_path last, or choose a new --trainer.default_root_dir"
            )

    def instantiate_classes(self) -> None:
        """Builds on one thread: a rank forked after a multi-threaded OpenMP region hangs (launcher.py)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            super().instantiate_classes()
            self.check_distributed_settings()
        except (MisconfigurationException, ValueError, TypeError) as error:
            self.parser.error(f"invalid configuration: {error}")
        finally:
            torch.set_num_threads(threads)  # sets the count only: no thread starts before the first parallel op

    def check_distributed_settings(self) -> None:
        """Checks now what Lightning and torch check only after processes start, with a traceback or a hang."""
        strategy = self.trainer.strategy
        if isinstance(strategy, ParallelStrategy) and strategy.cluster_environment is not None:
            strategy.cluster_environment.validate_settings(self.trainer.num_devices, self.trainer.num_nodes)
        backend = getattr(strategy, "process_group_backend", None)
        if backend is not None:
            check_backend(backend, on_gpu=isinstance(self.trainer.accelerator, CUDAAccelerator))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Adds what every run needs, whatever the config's callbacks: local CPU ranks forked from this process once it
        has built everything (launcher.py), crash-safe checkpoints, no per-hook profiler context without a profiler
        (overhead.py), a progress bar that redraws twice a second (unless the config gives its own), ``RunGuard``
        (the ``guard`` key) and, for fit with a logger, a learning-rate monitor (Lightning's raises without one); test
        and predict write their files.
        """
        trainer = super().instantiate_trainer(**kwargs)
        launcher = trainer.strategy.launcher
        if type(launcher) is _SubprocessScriptLauncher and isinstance(trainer.accelerator, CPUAccelerator):
            trainer.strategy._launcher = ForkLauncher(
                launcher.cluster_environment, launcher.num_processes, launcher.num_nodes
            )
        if type(trainer.profiler) is PassThroughProfiler:  # no profiler in the config
            trainer.profiler = NoProfiler()
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # the default: not one chosen in the config
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        bar = trainer.progress_bar_callback
        if type(bar) is RichProgressBar and bar not in (self._get(self.config_init, "trainer").callbacks or []):
            trainer.callbacks[trainer.callbacks.index(bar)] = RichProgressBar(PROGRESS_BAR_REFRESHES_PER_SECOND)
        # Only the subcommand's own: every callback is called at every hook of every step.
        stages = {self.subcommand} if self.subcommand else {"fit", "test", "predict"}  # run=False: any may follow
        if "fit" in stages and trainer.loggers:
            trainer.callbacks.append(LearningRateMonitor())
        if "test" in stages:
            trainer.callbacks.append(TestMetricsWriter())
        if "predict" in stages:
            trainer.callbacks.append(PredictionsWriter())
        return trainer


def check_backend(backend: str, on_gpu: bool) -> None:
    """Rejects a process-group backend torch does not know or has not built (e.g. ``nccl`` on CPU)."""
    names = [part.split(":")[-1] for part in backend.split(",")]  # also "cpu:gloo,cuda:nccl"
    if "nccl" in names and not on_gpu:
        raise ValueError("process_group_backend 'nccl' needs GPUs (--trainer.accelerator gpu); use gloo on CPU")
    for name in names:
        if name not in dist.Backend.backend_list:
            raise ValueError(f"unknown process_group_backend {name!r}: use nccl (GPUs), gloo (CPU or GPUs) or null")
        if not dist.is_backend_available(name):
            raise ValueError(f"process_group_backend {name!r} is not available in this torch build")


def main(args: list[str] | None = None) -> None:
    doctor.apply_debug_switch()
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["doctor"]:
        sys.exit(doctor.main(argv[1:]))
    if argv[:1] == ["sweep"]:
        from project import sweep  # Optuna is an optional extra

        sys.exit(sweep.main(argv[1:]))
    try:
        build_cli(args)
    finally:
        # torch asks every process to destroy its group before exiting; Lightning does so only for NCCL. Left to the
        # interpreter's exit, gloo's threads can abort it (pytorch/pytorch#190489).
        if dist.is_initialized():
            dist.destroy_process_group()


def build_cli(args: list[str] | None = None, run: bool = True) -> ProjectCLI:
    """The CLI that ``python -m project`` runs, with ARGS as its command line.

    ``run=False`` builds the Trainer, model and data without running a subcommand (scripts/step_cost.py).
    """
    return ProjectCLI(
        ClassificationModule,
        BaseDataModule,
        subclass_mode_data=True,
        trainer_defaults={"use_distributed_sampler": False},
        save_config_callback=runs.RunRecord,
        save_config_kwargs={"overwrite": False},
        parser_kwargs={"prog": program_name()},
        args=args,
        run=run,
    )


def program_name() -> str:
    """How the user called us, for usage and error lines: ``python -m project`` or the console command."""
    if Path(sys.argv[0]).name == "__main__.py":
        return f"python -m {__package__}"
    return Path(sys.argv[0]).name


if __name__ == "__main__":
    sys.exit(main())
