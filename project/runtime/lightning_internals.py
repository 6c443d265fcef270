"""Every part of Lightning's private API the template uses, in this one module, checked at start-up.

Lightning's public API covers almost everything; where it does not, the template reaches past it here and nowhere
else (``tests/test_boundary.py`` fails when another module does). Each part is one of two kinds:

- **correctness**: SIGTERM preemption and SLURM requeue, fail-fast, the CSV log a resumed run appends to, torchrun
  restarts. Without it a run could hang or lose work, so ``check()`` refuses to start and names the part.
- **speed**: the forked local ranks (time to first step), the skipped no-op hooks and the shared profiler context
  (per-step overhead), MFU's compute dtype. Without it the run falls back to Lightning's own behaviour, with one
  warning.

After upgrading Lightning, run ``python -m project doctor``: it lists every part and whether it is still there.
A part that is gone is mended here, in one place: find the name in the new Lightning's source, or drop the part.
"""

import contextlib
import csv
import functools
import importlib
import importlib.metadata
import inspect
import logging
import signal
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer, loggers
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_only
from torch.distributed.constants import default_pg_timeout


def _private(module: str, name: str) -> Any:
    """A private name of Lightning's, or None when this Lightning has moved or dropped it (``check`` says which)."""
    with contextlib.suppress(ImportError, AttributeError):
        return getattr(importlib.import_module(module), name)
    return None


_call = _private("lightning.pytorch.trainer", "call")
_FitLoop = _private("lightning.pytorch.loops.fit_loop", "_FitLoop")
_TrainingEpochLoop = _private("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop")
_SignalConnector = _private("lightning.pytorch.trainer.connectors.signal_connector", "_SignalConnector")
_SubprocessScriptLauncher = _private(
    "lightning.pytorch.strategies.launchers.subprocess_script", "_SubprocessScriptLauncher"
)
_launch_process_observer = _private(
    "lightning.fabric.strategies.launchers.subprocess_script", "_launch_process_observer"
)
_set_num_threads_if_needed = _private("lightning.fabric.utilities.distributed", "_set_num_threads_if_needed")
_init_dist_connection = _private("lightning.fabric.utilities.distributed", "_init_dist_connection")
_plugin_to_compute_dtype = _private("lightning.pytorch.callbacks.throughput_monitor", "_plugin_to_compute_dtype")


def _has(owner: Any, *names: str) -> bool:
    return owner is not None and all(callable(getattr(owner, name, None)) for name in names)


def _calls(function: Any, text: str) -> bool:
    """Whether FUNCTION's source still does TEXT: for behaviour the template relies on, not just a name."""
    try:
        return text in inspect.getsource(function)
    except (OSError, TypeError):
        return False


def _any_calls(cls: type, method: str, text: str) -> bool:
    """Whether METHOD of CLS or of a class it inherits from does TEXT (``__init__`` calls its parent's)."""
    return any(_calls(base.__dict__.get(method), text) for base in cls.__mro__)


@dataclass(frozen=True)
class Part:
    name: str
    correctness: bool
    reaches: str  # what of Lightning's, for the message
    present: Callable[[], bool]


PARTS = (
    Part(
        "SIGTERM preemption and SLURM requeue (runtime/preemption.py)",
        True,
        "_TrainingEpochLoop._broadcast_sigterm_tensor, _SignalConnector._sigterm_notifier_fn and"
        " _slurm_sigusr_handler_fn, and the handlers its teardown restores (_original_handlers, for Ctrl-C)",
        lambda: (
            _has(_TrainingEpochLoop, "_broadcast_sigterm_tensor")
            and _has(_SignalConnector, "_sigterm_notifier_fn", "_slurm_sigusr_handler_fn")
            and _calls(getattr(_SignalConnector, "register_signal_handlers", None), "self._original_handlers =")
            and _calls(getattr(_SignalConnector, "teardown", None), "self._original_handlers.items()")
        ),
    ),
    Part(
        "a run resumed at an epoch's end or last batch trains the next epoch (data/base.py, data/streaming.py)",
        True,
        "_FitLoop's epoch_progress and epoch_loop.batch_progress, and setup_data making the iterator before reset",
        lambda: (
            _calls(getattr(_FitLoop, "setup_data", None), "iter(self._data_fetcher)")
            and _calls(getattr(_FitLoop, "reset", None), "self.epoch_loop.batch_progress.is_last_batch")
        ),
    ),
    Part(
        "fail-fast and preemption's wait for launched ranks (runtime/faults.py)",
        True,
        "_SubprocessScriptLauncher (its procs and kill)",
        lambda: _has(_SubprocessScriptLauncher, "kill", "launch"),
    ),
    Part(
        "a resumed run appends to its metrics.csv (runs/loggers.py)",
        True,
        "ExperimentWriter._check_log_dir_exists, called from its __init__",
        lambda: _any_calls(ExperimentWriter, "__init__", "self._check_log_dir_exists()"),
    ),
    Part(
        "runs started together get their own folders (runs/loggers.py)",
        True,
        "CSVLogger._version and _get_next_version",
        lambda: (
            _has(loggers.CSVLogger, "_get_next_version") and _any_calls(loggers.CSVLogger, "__init__", "self._version")
        ),
    ),
    Part(
        "torchrun restarts join their own attempt's store (runtime/strategy.py)",
        True,
        "lightning.fabric.utilities.distributed._init_dist_connection, DDPStrategy._get_process_group_backend",
        lambda: _init_dist_connection is not None and _has(DDPStrategy, "_get_process_group_backend"),
    ),
    Part(
        "local CPU ranks forked, not re-run (runtime/launcher.py)",
        False,
        "_SubprocessScriptLauncher._check_can_spawn_children, _launch_process_observer, _set_num_threads_if_needed,"
        " trainer.call._call_and_handle_interrupt",
        lambda: (
            _has(_SubprocessScriptLauncher, "_check_can_spawn_children")
            and None not in (_launch_process_observer, _set_num_threads_if_needed)
            and _has(_call, "_call_and_handle_interrupt")
        ),
    ),
    Part(
        "no-op hooks skipped (this module)",
        False,
        "trainer.call skipping hooks that are not callable",
        lambda: (
            _calls(getattr(_call, "_call_callback_hooks", None), "if callable(fn)")
            and _calls(getattr(_call, "_call_lightning_module_hook", None), "if not callable(fn)")
        ),
    ),
    Part(
        "FSDP2 over every rank (runtime/sharding.py)",
        True,
        "ModelParallelStrategy._data_parallel_size, read by its setup_environment",
        lambda: _calls(ModelParallelStrategy.setup_environment, "self._data_parallel_size"),
    ),
    Part(
        "MFU beside samples/s (runtime/throughput.py)",
        False,
        "callbacks.throughput_monitor._plugin_to_compute_dtype",
        lambda: _plugin_to_compute_dtype is not None,
    ),
)


class LightningMismatch(RuntimeError):
    """The installed Lightning lacks a private part that a correctness feature replaces."""


@functools.cache
def missing_parts() -> tuple[Part, ...]:
    return tuple(part for part in PARTS if not part.present())


def check() -> None:
    """At start-up: fails when a correctness part is gone; warns once per speed part that is gone (falls back)."""
    missing = missing_parts()
    broken = [part for part in missing if part.correctness]
    if broken:
        lines = "\n".join(f"  - {part.name}: needs {part.reaches}" for part in broken)
        raise LightningMismatch(
            f"lightning {lightning.__version__} lacks private parts the template relies on for correctness:\n{lines}\n"
            "Install the Lightning range pinned in pyproject.toml, or mend"
            " project/runtime/lightning_internals.py."
        )
    for part in missing:
        warnings.warn(
            f"lightning {lightning.__version__} lacks {part.reaches}: {part.name} is off, Lightning's own behaviour"
            " is used (mend project/runtime/lightning_internals.py)",
            stacklevel=2,
        )


def has(name_start: str) -> bool:
    """Whether the part whose name starts with NAME_START is present in this Lightning."""
    return not any(part.name.startswith(name_start) for part in missing_parts())


def report() -> list[str]:
    """One line per part, for the doctor."""
    missing = missing_parts()
    return [
        f"{'MISSING' if part in missing else 'ok':>7}  {'correctness' if part.correctness else 'speed':<11} {part.name}"
        for part in PARTS
    ]


# Third-party warnings a run would print: (message, module that warns, package, its versions known to emit it).
KNOWN_NOISE = (
    # torch 2.10+ deprecates LeafSpec; Lightning 2.6's _pytree still builds one on every log call.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", "lightning.pytorch.utilities._pytree", "lightning", "2.6."),
    # Lightning's SLURM detection, on any machine with SLURM installed, for runs that are not SLURM jobs.
    (r"The `srun` command is available", "lightning.fabric.plugins.environments.slurm", "lightning", "2."),
    # Lightning 2.6's CLI calls jsonargparse APIs deprecated in 4.49.
    (r"(?s).*deprecated in v4\.49\.0", "lightning.pytorch.cli", "jsonargparse", "4."),
    (r"'set_vital' is deprecated", "torchdata.stateful_dataloader.stateful_dataloader", "torchdata", "0.11."),
    # Fewer training batches than log_every_n_steps (a small table): the step-loss windows count steps across epochs
    # and the epoch metrics are logged every epoch, so the logs the warning promises are there.
    (r"The number of training batches \(\d+\) is smaller than", "lightning.pytorch.loops.fit_loop", "lightning", "2."),
    # test/predict from a run's checkpoint write into a run folder of their own: ModelCheckpoint's state in the
    # checkpoint names the training run's folder, and is of no use there (a resumed fit stays in its run's folder).
    (r"The dirpath has changed from", "lightning.pytorch.callbacks.model_checkpoint", "lightning", "2."),
)

# Third-party log lines a run would print: (the message's start, the logger, package, its versions known to log it).
KNOWN_LOG_NOISE = (
    # Lightning 2.6 advertises LitLogger in every run that has another logger.
    ("💡 Tip: For seamless cloud logging", "lightning.pytorch.utilities.rank_zero", "lightning", "2.6."),
)


def silence_known_noise() -> None:
    for message, module, package, versions in KNOWN_NOISE:
        if importlib.metadata.version(package).startswith(versions):
            warnings.filterwarnings("ignore", message=message, module=module)
    for start, logger, package, versions in KNOWN_LOG_NOISE:
        if importlib.metadata.version(package).startswith(versions):
            logging.getLogger(logger).addFilter(_without(start))


@functools.cache  # one filter per message: adding it again is a no-op
def _without(start: str) -> Callable[[logging.LogRecord], bool]:
    return lambda record: not record.getMessage().startswith(start)


# Preemption (runtime/preemption.py): correctness.


def take_over_signals(
    trainer: Trainer,
    on_sigterm: Callable[[int, Any], None],
    on_requeue: Callable[[int, Any], None],
    on_interrupt: Callable[[int, Any], None] | None = None,
) -> None:
    """Lightning's per-step SIGTERM broadcast does nothing; ON_SIGTERM replaces its SIGTERM handler and ON_REQUEUE its
    SLURM requeue-signal handler (called in ``setup("fit")``, before Lightning registers its handlers). ON_INTERRUPT,
    when given, handles SIGINT from now on; Lightning's teardown puts SIGINT's previous handler back with the others
    (it records the handlers when it registers its own: SIGINT's is then ON_INTERRUPT, so the record is mended)."""
    connector = trainer._signal_connector
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
    connector._sigterm_notifier_fn = on_sigterm
    connector._slurm_sigusr_handler_fn = on_requeue
    if on_interrupt is None:
        return
    previous = signal.signal(signal.SIGINT, on_interrupt)

    def register_signal_handlers() -> None:
        _SignalConnector.register_signal_handlers(connector)
        connector._original_handlers[signal.SIGINT] = previous

    connector.register_signal_handlers = register_signal_handlers


def launched_processes(trainer: Trainer) -> list | None:
    """The local ranks Lightning's launcher (or ours) started from this process, as a live list; None when they were
    started by something else (torchrun, SLURM, a test)."""
    launcher = trainer.strategy.launcher
    return launcher.procs if isinstance(launcher, _SubprocessScriptLauncher) else None


def kill_launched(trainer: Trainer, signum: int) -> None:
    trainer.strategy.launcher.kill(signum)


# Resuming (data/base.py, data/streaming.py): correctness.


def resume_point(trainer: Trainer) -> tuple[int, bool]:
    """``(epoch, mid_epoch)`` for a train loader made now: the epoch its next batch belongs to, and whether that batch
    is inside the epoch (a loader position loaded from the checkpoint is then where it resumes; else the epoch starts).

    On resume Lightning makes the loader's iterator (``_FitLoop.setup_data``) before it moves past the epoch the
    checkpoint ended (``_FitLoop.reset``) and before it calls the sampler's ``set_epoch``: ``trainer.current_epoch``
    then still names the finished epoch, and a loader that draws its order as its iterator is made (torchdata's, or
    any with workers, which take indices ahead) would train that epoch's order again. Read as ``reset`` reads it: a
    checkpoint from an epoch's end has counted the epoch processed; one from its last batch has not, but marks that
    batch last, and Lightning goes on with the next epoch from its start.
    """
    epochs = trainer.fit_loop.epoch_progress.current
    inside = epochs.processed < epochs.started
    last_batch = inside and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
    return epochs.processed + int(last_batch), inside and not last_batch


# Logging (runs/loggers.py): correctness.


class _AppendingExperimentWriter(ExperimentWriter):
    """Keeps an existing ``metrics.csv``: its columns are taken as known, new rows are appended below its rows. Counts
    the rows logged (in the file and buffered), and can cut the file back to its first rows (a resume)."""

    rows_saved = 0  # in the file

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                reader = csv.DictReader(file)
                self.metrics_keys = list(reader.fieldnames or [])
                self.rows_saved = sum(1 for _ in reader)

    def save(self) -> None:
        self.rows_saved += len(self.metrics)
        super().save()

    @property
    def rows_logged(self) -> int:
        return self.rows_saved + len(self.metrics)

    def drop_rows(self, after: int, from_step: int) -> None:
        """Drops the rows after the first AFTER whose step is FROM_STEP or later, in the file (rewritten atomically)
        and in the buffer."""
        self.metrics = self.metrics[: max(0, after - self.rows_saved)]
        if after >= self.rows_saved:
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as file:
            reader = csv.DictReader(file)
            rows = [row for index, row in enumerate(reader) if index < after or int(row["step"]) < from_step]
        partial = f"{self.metrics_file_path}.partial"
        with self._fs.open(partial, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(rows)
        self._fs.mv(partial, self.metrics_file_path)
        self.rows_saved = len(rows)


def appending_csv_experiment(logger: Any) -> ExperimentWriter:
    """The ``experiment`` of a Lightning ``CSVLogger`` whose writer appends instead of deleting an existing file."""
    if logger._experiment is None:
        logger._fs.makedirs(logger.root_dir, exist_ok=True)
        logger._experiment = _AppendingExperimentWriter(log_dir=logger.log_dir)
    return logger._experiment


def logger_version(logger: Any, claim: Callable[[Path], int]) -> int | str:
    """A Lightning logger's version, as its ``version`` property gives it, except that on rank 0 a new run's number
    comes from CLAIM (the folder is created as the number is chosen); other ranks only read the number."""
    if logger._version is None:
        root = Path(logger.root_dir)
        logger._version = claim(root) if rank_zero_only.rank == 0 else logger._get_next_version()
    return logger._version


# Process groups (runtime/strategy.py): correctness.


def join_process_group(strategy: DDPStrategy, store: dist.Store) -> None:
    """Initialises the process group through STORE the way Lightning's ``setup_distributed`` would; Lightning's setup
    then finds it ready."""
    strategy.set_world_ranks()
    device_id = strategy.root_device if strategy.root_device.type != "cpu" else None  # as Lightning passes it
    backend = strategy._get_process_group_backend()
    _init_dist_connection(
        strategy.cluster_environment, backend, store=store, timeout=strategy._timeout, device_id=device_id
    )


def process_group_timeout(strategy: Any) -> timedelta:
    """How long a rank waits for its peers (Lightning's DDP, FSDP and model-parallel strategies keep it)."""
    return getattr(strategy, "_timeout", None) or default_pg_timeout


def set_mesh_sizes(strategy: Any, data_parallel_size: int) -> None:
    """Every rank on ``ModelParallelStrategy``'s data-parallel dimension (its "auto" puts the local ranks on the
    tensor-parallel one); set before its ``setup_environment`` builds the mesh."""
    strategy._data_parallel_size = data_parallel_size


# Throughput (runtime/throughput.py): speed.


def compute_dtype(trainer: Trainer) -> Any:
    """The dtype the run computes in (``bf16-mixed``: bfloat16); None where this Lightning cannot say."""
    return _plugin_to_compute_dtype(trainer.precision_plugin) if _plugin_to_compute_dtype else None


# The launcher (runtime/launcher.py): speed.

ScriptLauncher = _SubprocessScriptLauncher or object  # Lightning's launcher that re-runs the command per local rank


def check_can_spawn_children(launcher: Any) -> None:
    launcher._check_can_spawn_children()


def watch_launched(procs: list) -> None:
    """Lightning's watcher thread: once a launched rank exits non-zero, it kills this process too."""
    _launch_process_observer(procs)


def set_num_threads(num_processes: int) -> None:
    """Lightning's share of the cores per local rank (OMP_NUM_THREADS unless set)."""
    _set_num_threads_if_needed(num_processes=num_processes)


def run_as_trainer(trainer: Trainer, function: Callable, *args: Any, **kwargs: Any) -> Any:
    """Runs FUNCTION as ``Trainer.fit`` and friends do: exceptions go to callbacks' ``on_exception`` and teardown."""
    return _call._call_and_handle_interrupt(trainer, function, *args, **kwargs)


def install_fork_launcher(trainer: Trainer, launcher_class: type) -> None:
    """Replaces Lightning's script launcher with LAUNCHER_CLASS (built from it) for CPU runs it would start itself."""
    launcher = trainer.strategy.launcher
    if not has("local CPU ranks forked") or not isinstance(trainer.accelerator, CPUAccelerator):
        return
    if type(launcher) is _SubprocessScriptLauncher:
        trainer.strategy._launcher = launcher_class(
            launcher.cluster_environment, launcher.num_processes, launcher.num_nodes
        )


# Per-step overhead: speed. Lightning calls about ten hooks a step on the module and on every callback, each through a
# profiler context (trainer/call.py). It skips a hook attribute that is not callable, and asks trainer.profiler for
# each context: hooks inherited as no-ops are hidden behind None on the instance, and "no profiler" hands out one
# shared context. What a hook does is never changed.

TRAINING_STEP_HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward")
TRAINING_STEP_HOOKS += ("on_before_optimizer_step", "on_before_zero_grad")
# On callbacks only: Lightning reads the module's evaluation batch hooks' signatures (dataloader_idx).
EVALUATION_BATCH_HOOKS = tuple(
    f"{stage}_batch_{when}" for stage in ("on_validation", "on_test", "on_predict") for when in ("start", "end")
)


class NoProfiler(PassThroughProfiler):
    """Lightning's default (no profiler), with one shared empty context instead of a new generator context per hook
    call. A profiler set in the config replaces it as usual."""

    _context = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext:  # type: ignore[override]
        return self._context


def install_no_profiler(trainer: Trainer) -> None:
    if type(trainer.profiler) is PassThroughProfiler:  # no profiler in the config
        trainer.profiler = NoProfiler()


def skip_noop_hooks(trainer: Trainer) -> None:
    """Hides the batch hooks each callback, and the training-step hooks the module, inherit as no-ops; and the
    ``ModelCheckpoint`` hooks that cannot save with its settings. Called once the callback list is final."""
    if not has("no-op hooks skipped"):
        return
    owners: list[tuple[Any, type, tuple[str, ...]]] = [
        (callback, Callback, TRAINING_STEP_HOOKS + EVALUATION_BATCH_HOOKS) for callback in trainer.callbacks
    ]
    if isinstance(trainer.lightning_module, LightningModule):
        owners.append((trainer.lightning_module, LightningModule, TRAINING_STEP_HOOKS))
    for owner, base, hooks in owners:
        for hook in hooks:
            if getattr(type(owner), hook) is getattr(base, hook):
                setattr(owner, hook, None)
    _skip_idle_checkpoint_hooks(trainer.callbacks)


def _skip_idle_checkpoint_hooks(callbacks: Sequence[Callback]) -> None:
    """ModelCheckpoint checks its step and time triggers at every batch end, and deep-copies the logged metrics at
    every epoch end even when it saves nothing: the batch hook goes without ``every_n_train_steps`` or
    ``train_time_interval``; the epoch hooks go with ``save_top_k: 0`` and ``save_last: false``."""
    for callback in callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        if getattr(callback, "_every_n_train_steps", 1) < 1 and getattr(callback, "_train_time_interval", 0) is None:
            callback.on_train_batch_end = None
        if callback.save_top_k == 0 and not callback.save_last:
            callback.on_train_epoch_end = callback.on_validation_end = None
