"""The command line: LightningCLI, wired to this project's module, data, run folders and runtime.

``python -m project {fit,validate,test,predict} --config configs/digits.yaml [--key value ...]``.
Every config key is a constructor argument of the Trainer, the model, the data module, the checkpoint callback
(``checkpoint``), the periodic checkpoint (``periodic``) or the preemption check (``preemption``); this file only
links them together and adds what every run needs: the safeguards, one callback per concern (``add_safeguards``).

One callback per concern, not one for all: each costs Lightning a call of each of its hooks (about 6 a training step,
up to 4 µs a call on a 2-core CPU: docs/performance.md), so the four more cost about 100 µs a step, negligible
against a CNN row's 0.4 s step (about a tenth of the digits MLP's 0.9 ms step, which no real model is).
"""

import json
import os
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from trainfleet import lightning_internals as internals
from trainfleet import program
from trainfleet.checkpoints.files import AtomicCheckpointIO, CheckpointError, check_checkpoint
from trainfleet.checkpoints.periodic import PeriodicCheckpoint
from trainfleet.checks import SettingsError, check_settings, cpu_processes_note, cpu_processes_problem
from trainfleet.data import BaseDataModule
from trainfleet.errors import ProjectArgumentParser, constructor_error
from trainfleet.messages import first_line, report
from trainfleet.runs import folders, goodput, lock, summary
from trainfleet.runs.failures import FailureFile
from trainfleet.runs.outputs import PredictionsWriter, ProgressBar, TestMetricsWriter
from trainfleet.runtime import network
from trainfleet.runtime.known_noise import silence_known_noise
from trainfleet.runtime.launcher import ForkLauncher, one_thread
from trainfleet.runtime.preemption import PreemptionCheck
from trainfleet.runtime.safeguards import Safeguards

PROGRESS_BAR_REFRESH_RATE = 2  # batches between redraws: the bar's thread competes with training for the GIL


class ProjectCLI(LightningCLI):
    run_plan = folders.RunPlan()  # where the subcommand's run goes (runs/folders.py)
    checkpoint_shapes: dict[str, tuple[int, ...]] | None = None  # of --ckpt_path's weights, read before building
    checkpoint_named: str | None = None  # --ckpt_path as given: last|best|auto, or a path

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir")  # a list: folders.py
        parser.add_lightning_class_args(PreemptionCheck, "preemption")  # the other safeguards: run_callbacks()
        parser.add_lightning_class_args(PeriodicCheckpoint, "periodic")  # last.ckpt every so much time (off by default)
        parser.add_class_arguments(Safeguards, "safeguards")  # each on by default, each a switch
        parser.set_defaults({"checkpoint.save_last": True})
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.network.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.network.init_args.input_shape", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Resolves ``--ckpt_path last|best|auto`` and refuses what cannot run, before anything is built or written
        (LightningCLI would next read the checkpoint's hyperparameters, failing with a raw traceback)."""
        try:
            super().parse_arguments(parser, args)
        except UnicodeDecodeError as error:  # jsonargparse reads a config file as text, and lets this through
            parser.error(f"a --config file is not a text (UTF-8) file: {error}")
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config  # none: run=False, built but not run
        try:
            check_settings(config)
        except SettingsError as error:
            parser.error(str(error))
        if not subcommand:
            return
        given = config.ckpt_path  # before prepare_run resolves last/best/auto to a file
        try:
            self.run_plan = folders.prepare_run(config, subcommand)
            self.save_config_kwargs["config_filename"] = self.run_plan.config_filename
            self.save_config_kwargs["new_run"] = self.run_plan.folder is None
            if config.ckpt_path and config.ckpt_path not in folders.LIGHTNING_CKPT_ALIASES:
                self.checkpoint_shapes = check_checkpoint(config.ckpt_path)
                self.checkpoint_named = given
                folders.check_found_network(config, given)
        except (folders.RunFolderError, CheckpointError) as error:
            parser.error(str(error))

    def instantiate_classes(self) -> None:
        """Builds on one thread (ranks are forked from this process: runtime/launcher.py) and checks the settings."""
        try:
            with one_thread():
                super().instantiate_classes()
            self.check_distributed_settings()
            self.check_network_output()
            self.check_checkpoint_fits()
        except (MisconfigurationException, ValueError, TypeError) as error:
            self.parser.error(constructor_error(error) or f"invalid configuration: {error}")

    def check_network_output(self) -> None:
        """Refuses, before anything runs or is written, a network that cannot take one input of the data's shape or
        gives other than ``num_classes`` outputs: one forward pass on one (zero) sample. Training would fail at its
        first step with neither number (``Target 2 is out of bounds``)."""
        network, data = getattr(self.model, "network", None), self.datamodule
        shape, classes = getattr(data, "input_shape", None), getattr(data, "num_classes", None)
        if not isinstance(network, torch.nn.Module) or shape is None or classes is None:
            return
        name = type(network).__qualname__
        training = network.training
        network.eval()  # one sample: BatchNorm in training mode refuses it
        try:
            with torch.no_grad():
                output = network(torch.zeros(1, *shape))
        except Exception as error:  # whatever the network raises: the user's code
            raise ValueError(
                f"the network ({name}) cannot take one input of the data's shape {tuple(shape)}: {first_line(error)}"
            ) from error
        finally:
            network.train(training)
        if not isinstance(output, torch.Tensor) or output.shape != (1, classes):
            got = tuple(output.shape[1:]) if isinstance(output, torch.Tensor) else type(output).__name__
            raise ValueError(
                f"the network ({name}) gives {got[0] if len(got) == 1 else got} outputs per sample, the data has"
                f" {classes} classes: its last layer must have num_classes ({classes}) outputs"
            )

    def check_checkpoint_fits(self) -> None:
        """Refuses, before anything runs, a checkpoint whose weights are not this network's (another architecture),
        naming the run it was found in (``--ckpt_path last`` in a folder another experiment shares)."""
        if self.checkpoint_shapes is None:
            return
        ours = {key: tuple(value.shape) for key, value in self.model.state_dict().items()}
        if ours != self.checkpoint_shapes:
            config = self.config[self.subcommand] if self.subcommand else self.config
            found = self.checkpoint_named != config.ckpt_path  # last/best/auto: the newest run in the folder
            raise ValueError(
                f"{folders.describe_checkpoint(config.ckpt_path, self.checkpoint_named)} holds another network's"
                f" weights than the config's: {weights_difference(ours, self.checkpoint_shapes)}"
                + (f"; {folders.ANOTHER_EXPERIMENT}" if found else "")
            )

    def check_distributed_settings(self) -> None:
        """Checks now what Lightning and torch check only after processes start, with a traceback or a hang."""
        strategy = self.trainer.strategy
        if isinstance(strategy, ParallelStrategy) and strategy.cluster_environment is not None:
            strategy.cluster_environment.validate_settings(self.trainer.num_devices, self.trainer.num_nodes)
        if self.trainer.world_size > 1:
            network.check_environment(os.environ)  # an InterfaceError is a ValueError: refused
        backend = getattr(strategy, "process_group_backend", None)
        if backend is not None:
            check_backend(backend, on_gpu=isinstance(self.trainer.accelerator, CUDAAccelerator))
        if isinstance(self.trainer.accelerator, CPUAccelerator):
            if problem := cpu_processes_problem(self.trainer.num_devices):
                raise ValueError(problem)
            if (note := cpu_processes_note(self.trainer.num_devices)) and rank_zero_only.rank == 0:
                report(note)  # once per run: an external launcher's processes each run this check

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Adds what every run needs, whatever the config's callbacks: forked local CPU ranks, crash-safe
        checkpoints, the progress bar (unless the config gives its own), the safeguards (``run_callbacks``) and,
        for fit, the goodput record and, with a logger, a learning-rate monitor; test and predict write their files."""
        trainer = super().instantiate_trainer(**kwargs)
        add_safeguards(trainer, self.configured("safeguards"))
        if hasattr(trainer.strategy, "run_facts"):  # every node must run this config (runtime/rendezvous.py)
            config = self.config[self.subcommand] if self.subcommand else self.config
            trainer.strategy.run_facts = folders.flatten(json.dumps(config.as_dict(), default=str))
        internals.install_fork_launcher(trainer, ForkLauncher)
        internals.start_next_epoch_afresh(trainer)
        internals.skip_idle_callback_hooks(trainer)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # the default: not one chosen in the config
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        bar = trainer.progress_bar_callback
        if type(bar) is RichProgressBar and bar not in self.configured_callbacks():
            trainer.callbacks[trainer.callbacks.index(bar)] = ProgressBar(PROGRESS_BAR_REFRESH_RATE)
        # Only the subcommand's own: every callback is called at every hook of every step.
        stages = {self.subcommand} if self.subcommand else {"fit", "test", "predict"}  # run=False: any may follow
        if "fit" in stages and trainer.loggers:
            trainer.callbacks.append(LearningRateMonitor())
        if "fit" in stages:
            trainer.callbacks.append(FailureFile())
            # First: a step's time ends before the other callbacks' end-of-step work (runs/goodput.py).
            trainer.callbacks.insert(0, goodput.Goodput(self.run_plan.restart))
        if "test" in stages:
            trainer.callbacks.append(TestMetricsWriter())
        if "predict" in stages:
            trainer.callbacks.append(PredictionsWriter())
        return trainer

    def before_fit(self) -> None:
        """A run without numbered run folders trains in ``default_root_dir``, which its owner holds now, after every
        refusal and before any rank starts (runs/lock.py; a numbered one is held when resumed or claimed)."""
        config = self.config[self.subcommand]
        if folders.versions_folder(config.trainer) is None and lock.owns_runs():
            lock.hold(self.trainer.default_root_dir)

    def after_fit(self) -> None:
        summary.say_fit_ended(self.trainer)
        goodput.say_goodput(self.trainer)

    def after_validate(self) -> None:
        summary.say_validate_ended(self.trainer, self.config[self.subcommand].ckpt_path)

    def configured_callbacks(self) -> list:
        return self.configured("trainer").get("callbacks") or []

    def configured(self, key: str) -> Any:
        """KEY's instantiated value in the subcommand's config (the top-level one with ``run=False``)."""
        return (self.config_init[self.subcommand] if self.subcommand else self.config_init)[key]


def add_safeguards(trainer: Trainer, safeguards: Safeguards) -> None:
    """The callbacks every run gets (each a switch of the ``safeguards`` key, on by default: runtime/safeguards.py),
    one concern each, just before the ``preemption`` key's ``PreemptionCheck`` (so after the config's callbacks;
    Lightning orders ``ModelCheckpoint`` last). Their order is their hooks' order:

    - ``FailFast`` (runtime/faults.py): the heartbeat; on an exception, names the failed rank and stops the others;
    - ``NaNGuard`` (runtime/nan_guard.py): a NaN loss stops the run before a checkpoint is saved;
    - ``Throughput`` (runtime/throughput.py): samples/s, TFLOP/s and MFU, after the window's loss;
    - ``ResumeState`` (checkpoints/resume_state.py): RNG states and ``metrics.csv`` rows in checkpoints, restored on
      resume;
    - ``PreemptionCheck`` (runtime/preemption.py): SIGTERM, the requeue signal and Ctrl-C; its stop comes after the
      step's other work, and its ``on_exception`` after ``FailFast``'s.
    """
    at = next(
        (index for index, callback in enumerate(trainer.callbacks) if isinstance(callback, PreemptionCheck)), None
    )
    if at is None:  # jsonargparse accepts `trainer: 0` in a config file, and then builds none of the config's callbacks
        raise ValueError("trainer must be a mapping of its arguments in every config file (key: value lines under it)")
    trainer.callbacks[at:at] = safeguards.callbacks()


def weights_difference(ours: dict[str, tuple[int, ...]], theirs: dict[str, tuple[int, ...]], most: int = 3) -> str:
    """The first MOST weights that differ, in words: which the checkpoint lacks or adds, which have another shape."""
    reshaped = [key for key, shape in ours.items() if theirs.get(key, shape) != shape]
    parts = [f"{key} is {theirs[key]} there, {ours[key]} here" for key in reshaped]
    parts += [f"{key} is not in it" for key in ours if key not in theirs]
    parts += [f"{key} is only in it" for key in theirs if key not in ours]
    return "; ".join(parts[:most]) + (f" (and {len(parts) - most} more)" if len(parts) > most else "")


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


def build_cli(
    args: list[str] | None = None, run: bool = True, prog: str | None = None, epilog: str | None = None
) -> ProjectCLI:
    """The CLI that ``python -m project`` runs, with ARGS as its command line.

    ``run=False`` builds the Trainer, model and data without running a subcommand (benchmarks/step_cost.py). EPILOG
    ends the top-level help (``__main__`` lists its other commands there).
    """
    internals.check()
    silence_known_noise()
    return ProjectCLI(
        program.lightning_module(),
        BaseDataModule,
        subclass_mode_data=True,
        auto_configure_optimizers=False,  # one way to set them: model.optimizer/model.scheduler, saved in config.yaml
        parser_class=ProjectArgumentParser,
        trainer_defaults={"use_distributed_sampler": False},
        save_config_callback=folders.RunRecord,
        save_config_kwargs={"overwrite": False},
        parser_kwargs={"prog": prog or "python -m project", "epilog": epilog},
        args=args,
        run=run,
    )
