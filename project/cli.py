"""The command line: LightningCLI with this project's wiring.

``python -m project {fit,validate,test,predict} --config configs/digits.yaml [--key value ...]``.
``python -m project doctor [...]`` reports the distributed setup instead (project/doctor.py).
Every config key is a constructor argument of the Trainer, the model, the data module or the
checkpoint callback; this file only links them together and guards the run folder.
"""

import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from project import doctor
from project.callbacks import PredictionsWriter, SamplesPerSecond, TestMetricsWriter
from project.checkpointing import AtomicCheckpointIO, CheckpointError, RNGStateCheckpoint, load_checkpoint_file
from project.data import BaseDataModule
from project.faults import FailFast, NonFiniteGuard
from project.module import ClassificationModule

# Names Trainer.fit/test/... resolve themselves instead of reading a file.
LIGHTNING_CKPT_ALIASES = ("last", "best", "hpc", "registry")
# Lightning's default Rich bar redraws up to 100 times a second, from a thread that competes with training for the
# GIL: measured in a terminal, that cost a small CPU step about 20%. Twice a second is as readable.
PROGRESS_BAR_REFRESHES_PER_SECOND = 2


def checkpoint_dir(root_dir: str | None) -> str:
    """Checkpoints live in one fixed folder per run, so ``--ckpt_path last`` always finds ``last.ckpt``."""
    return os.path.join(root_dir or os.getcwd(), "checkpoints")


class ProjectCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True})
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath", compute_fn=checkpoint_dir)
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir")
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.network.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.network.init_args.input_shape", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Fail before anything is built or written when the checkpoint named on the command line is unusable.

        Runs before LightningCLI reads the checkpoint's hyperparameters, which would fail with a raw traceback.
        """
        super().parse_arguments(parser, args)
        ckpt_path = self.config.get(self.config.get("subcommand") or "", {}).get("ckpt_path")
        if ckpt_path and ckpt_path not in LIGHTNING_CKPT_ALIASES:
            try:
                load_checkpoint_file(ckpt_path, mmap=True)  # mmap: reads the structure, not every tensor
            except CheckpointError as error:
                parser.error(str(error))

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
            self.check_distributed_settings()
        except (MisconfigurationException, ValueError, TypeError) as error:
            self.parser.error(f"invalid configuration: {error}")

    def check_distributed_settings(self) -> None:
        """Checks now what Lightning and torch check only after processes start, with a traceback or a hang."""
        strategy = self.trainer.strategy
        if isinstance(strategy, ParallelStrategy) and strategy.cluster_environment is not None:
            strategy.cluster_environment.validate_settings(self.trainer.num_devices, self.trainer.num_nodes)
        backend = getattr(strategy, "process_group_backend", None)
        if backend is not None:
            check_backend(backend, on_gpu=isinstance(self.trainer.accelerator, CUDAAccelerator))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Adds what every run needs, whatever the config's callbacks: crash-safe checkpoints, a progress bar
        that redraws twice a second (unless the config gives its own), fail-fast handling; for fit, the NaN guard,
        RNG states for an exact resume, samples/s and, when there is a logger, a learning-rate monitor (Lightning's
        raises without one); test and predict write their files."""
        trainer = super().instantiate_trainer(**kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # the default: not one chosen in the config
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        bar = trainer.progress_bar_callback
        if type(bar) is RichProgressBar and bar not in (self._get(self.config_init, "trainer").callbacks or []):
            trainer.callbacks[trainer.callbacks.index(bar)] = RichProgressBar(PROGRESS_BAR_REFRESHES_PER_SECOND)
        # Only the subcommand's own: every callback is called at every hook of every step.
        # First in the list: they run before ModelCheckpoint, which Lightning puts last.
        stages = {self.subcommand} if self.subcommand else {"fit", "test", "predict"}  # run=False: any may follow
        trainer.callbacks.insert(0, FailFast())
        if "fit" in stages:
            trainer.callbacks[1:1] = [NonFiniteGuard(), RNGStateCheckpoint(), SamplesPerSecond()]
            if trainer.loggers:
                trainer.callbacks.append(LearningRateMonitor())
        if "test" in stages:
            trainer.callbacks.append(TestMetricsWriter())
        if "predict" in stages:
            trainer.callbacks.append(PredictionsWriter())
        return trainer

    def before_fit(self) -> None:
        """Refuse to start a fresh run on top of an earlier one's checkpoints."""
        ckpt_dir = Path(self.config.fit.checkpoint.dirpath)
        # A requeued SLURM job: Lightning resumes from the hpc_ckpt_N.ckpt it saved in default_root_dir.
        requeued = SLURMEnvironment.detect() and any(Path(self.trainer.default_root_dir).glob("hpc_ckpt_*.ckpt"))
        if self.config.fit.ckpt_path is None and not requeued and any(ckpt_dir.glob("*.ckpt")):
            self.parser.error(
                f"the run folder already holds checkpoints ({ckpt_dir}); resume with --ckpt_path last"
                " or choose a new --trainer.default_root_dir"
            )


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
    ProjectCLI(
        ClassificationModule,
        BaseDataModule,
        subclass_mode_data=True,
        trainer_defaults={"use_distributed_sampler": False},
        save_config_kwargs={"overwrite": False},
        args=args,
    )


if __name__ == "__main__":
    sys.exit(main())
