"""Every part of Lightning's private API the template uses, in this one module, checked by name at start-up.

Lightning's public API covers almost everything; where it does not, the template reaches past it here and nowhere
else (``tests/test_boundary.py`` fails when another module does, and when a private name used here is not in a part's
``names``). Each part lists the private names it touches, as ``module:Owner.name``; a name is found when the owner
has it, or, for an instance attribute, when one of the owner's methods assigns it. Two kinds:

- **correctness**: without it a run could hang or lose work, so ``check()`` refuses to start (exit 2), naming it.
- **speed**: optional; without it Lightning's own behaviour is used, with one warning.

After upgrading Lightning, ``python -m project doctor`` lists every part; a part that is gone is mended here: find
the names in the new Lightning's source, or drop the part.
"""

import csv
import dis
import functools
import importlib
import inspect
import signal
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType
from typing import Any

import lightning
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.trainer import call


@dataclass(frozen=True)
class Part:
    name: str
    correctness: bool
    names: tuple[str, ...]  # every private name of Lightning's the part touches, as "module:Owner.name"


PREEMPTION = Part(
    "SIGTERM preemption and SLURM requeue (runtime/preemption.py)",
    True,
    (
        "lightning.pytorch.trainer.trainer:Trainer._signal_connector",
        "lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector._sigterm_notifier_fn",
        "lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector._slurm_sigusr_handler_fn",
        # Ctrl-C: the handlers Lightning records when it registers its own, and its teardown restores.
        "lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector",
        "lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector._original_handlers",
    ),
)
RESUME_POINT = Part(
    "a run resumed at an epoch's end or last batch trains the next epoch once (data/base.py, streaming.py, cli.py)",
    True,
    (
        "lightning.pytorch.loops.fit_loop:_FitLoop.epoch_progress",
        "lightning.pytorch.loops.training_epoch_loop:_TrainingEpochLoop.batch_progress",
        "lightning.pytorch.loops.progress:_BatchProgress.is_last_batch",
        # The order resume_point relies on: setup_data makes the iterator, then reset moves past a finished epoch.
        "lightning.pytorch.loops.fit_loop:_FitLoop.setup_data._data_fetcher",
        "lightning.pytorch.loops.fit_loop:_FitLoop.reset.is_last_batch",
        # start_next_epoch_afresh: the stage that reset moves past a last batch in, and on_advance_start's use of it.
        "lightning.pytorch.loops.fit_loop:_FitLoop.reset",
        "lightning.pytorch.loops.fit_loop:_FitLoop.restarted_mid_epoch",
        "lightning.pytorch.loops.fit_loop:_FitLoop.on_advance_start.restarted_mid_epoch",
        "lightning.pytorch.loops.fit_loop:_FitLoop.reset_restart_stage",
        "lightning.pytorch.loops.fit_loop:_FitLoop._restarting",
        "lightning.pytorch.loops.training_epoch_loop:_TrainingEpochLoop.restarted_on_train_batch_end",
    ),
)
FAIL_FAST = Part(
    "fail-fast and preemption's wait for launched ranks (runtime/faults.py)",
    True,
    (
        "lightning.pytorch.strategies.launchers.subprocess_script:_SubprocessScriptLauncher.procs",
        "lightning.pytorch.strategies.launchers.subprocess_script:_SubprocessScriptLauncher.kill",
    ),
)
APPENDING_CSV = Part(
    "a resumed run appends to its metrics.csv (runs/loggers.py)",
    True,
    (
        "lightning.pytorch.loggers.csv_logs:ExperimentWriter._check_log_dir_exists",
        "lightning.pytorch.loggers.csv_logs:ExperimentWriter._fs",
        "lightning.pytorch.loggers.csv_logs:CSVLogger._experiment",
        "lightning.pytorch.loggers.csv_logs:CSVLogger._fs",
    ),
)
FSDP2_MESH = Part(
    "FSDP2 over every rank (runtime/sharding.py)",
    True,
    ("lightning.pytorch.strategies.model_parallel:ModelParallelStrategy._data_parallel_size",),
)
NO_PER_STEP_BROADCAST = Part(
    "no SIGTERM broadcast (and GPU sync) every step (runtime/preemption.py)",
    False,
    ("lightning.pytorch.loops.training_epoch_loop:_TrainingEpochLoop._broadcast_sigterm_tensor",),
)
FORKED_RANKS = Part(
    "local CPU ranks forked, not re-run (runtime/launcher.py)",
    False,
    (
        "lightning.pytorch.strategies.launchers.subprocess_script:_SubprocessScriptLauncher",
        "lightning.pytorch.strategies.launchers.subprocess_script:_SubprocessScriptLauncher._check_can_spawn_children",
        "lightning.pytorch.strategies.strategy:Strategy._launcher",
        "lightning.fabric.strategies.launchers.subprocess_script:_launch_process_observer",
        "lightning.fabric.utilities.distributed:_set_num_threads_if_needed",
        "lightning.pytorch.trainer.call:_call_and_handle_interrupt",
    ),
)
NO_IDLE_HOOK_CALLS = Part(
    "a callback hook called on the callbacks that override it only (a digits step: 13 calls, not 84)",
    False,
    (
        "lightning.pytorch.trainer.call:_call_callback_hooks",
        # what Lightning's loop sets around the calls: the hook a callback's self.log is checked against
        "lightning.pytorch.core.module:LightningModule._current_fx_name",
    ),
)
PARTS = (
    PREEMPTION,
    RESUME_POINT,
    FAIL_FAST,
    APPENDING_CSV,
    FSDP2_MESH,
    NO_PER_STEP_BROADCAST,
    FORKED_RANKS,
    NO_IDLE_HOOK_CALLS,
)


def _code_objects(code: CodeType) -> Iterator[CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _code_objects(constant)


@functools.cache
def _assigned_attributes(cls: type) -> frozenset[str]:
    """The attributes the methods of CLS and of its bases assign (``self.name = ...``): its instance attributes."""
    names = set()
    for base in cls.__mro__:
        for member in vars(base).values():
            function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            function = inspect.unwrap(function) if callable(function) else function  # through decorators
            if code := getattr(function, "__code__", None):
                for inner in _code_objects(code):
                    names |= {op.argval for op in dis.get_instructions(inner) if op.opname == "STORE_ATTR"}
    return frozenset(names)


def lookup(path: str) -> Any:
    """What PATH (``module:Owner.name`` or ``module:name``) names; None when this Lightning has moved or dropped it."""
    module, _, qualname = path.partition(":")
    try:
        found: Any = importlib.import_module(module)
    except ImportError:
        return None
    for name in qualname.split("."):
        found = getattr(found, name, None)
        if found is None:
            return None
    return found


def found(path: str) -> bool:
    """Whether this Lightning has PATH: the owner has the name, or one of the owner's methods assigns it, or, when the
    owner is a function, the function uses the name."""
    module, _, qualname = path.partition(":")
    owner_name, _, name = qualname.rpartition(".")
    if not owner_name:
        return lookup(path) is not None
    owner = lookup(f"{module}:{owner_name}")
    if inspect.isfunction(owner):
        return any(name in code.co_names for code in _code_objects(inspect.unwrap(owner).__code__))
    return hasattr(owner, name) or (isinstance(owner, type) and name in _assigned_attributes(owner))


@functools.cache
def missing_parts() -> tuple[Part, ...]:
    return tuple(part for part in PARTS if not all(found(path) for path in part.names))


def has(part: Part) -> bool:
    return part not in missing_parts()


def gone(part: Part) -> list[str]:
    return [path for path in part.names if not found(path)]


class LightningMismatch(RuntimeError):
    """The installed Lightning lacks a private part that a correctness feature relies on."""


def check() -> None:
    """At start-up: fails when a correctness part is gone; warns once per speed part that is gone (falls back)."""
    missing = missing_parts()
    if broken := [part for part in missing if part.correctness]:
        lines = "\n".join(f"  - {part.name}: needs {', '.join(gone(part))}" for part in broken)
        raise LightningMismatch(
            f"lightning {lightning.__version__} lacks private parts the template relies on for correctness:\n{lines}\n"
            "Install the Lightning range pinned in pyproject.toml, or mend trainfleet/lightning_internals.py."
        )
    for part in missing:
        warnings.warn(
            f"lightning {lightning.__version__} lacks {', '.join(gone(part))}: {part.name} is off, Lightning's own"
            " behaviour is used (mend trainfleet/lightning_internals.py)",
            stacklevel=2,
        )


def report() -> list[str]:
    """One line per part, for the doctor."""
    kinds = {True: "correctness", False: "speed"}
    return [f"{'ok' if has(part) else 'MISSING':>7}  {kinds[part.correctness]:<11} {part.name}" for part in PARTS]


_SubprocessScriptLauncher = lookup("lightning.pytorch.strategies.launchers.subprocess_script:_SubprocessScriptLauncher")
_SignalConnector = lookup("lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector")
_launch_process_observer = lookup("lightning.fabric.strategies.launchers.subprocess_script:_launch_process_observer")
_set_num_threads_if_needed = lookup("lightning.fabric.utilities.distributed:_set_num_threads_if_needed")
_call_and_handle_interrupt = lookup("lightning.pytorch.trainer.call:_call_and_handle_interrupt")
_call_callback_hooks = lookup("lightning.pytorch.trainer.call:_call_callback_hooks")


# Preemption (runtime/preemption.py).


def take_over_signals(
    trainer: Trainer,
    on_sigterm: Callable[[int, Any], None],
    on_requeue: Callable[[int, Any], None],
    on_interrupt: Callable[[int, Any], None] | None = None,
) -> None:
    """ON_SIGTERM replaces Lightning's SIGTERM handler and ON_REQUEUE its SLURM requeue-signal handler (called in
    ``setup("fit")``, before Lightning registers its handlers); Lightning's per-step SIGTERM broadcast, which then
    always broadcasts 0, does nothing. ON_INTERRUPT, when given, handles SIGINT from now on; Lightning's teardown puts
    SIGINT's previous handler back with the others (it records the handlers when it registers its own: SIGINT's is
    then ON_INTERRUPT, so the record is mended)."""
    connector = trainer._signal_connector
    connector._sigterm_notifier_fn = on_sigterm
    connector._slurm_sigusr_handler_fn = on_requeue
    if has(NO_PER_STEP_BROADCAST):
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
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
    return processes_of(trainer.strategy.launcher)


def processes_of(launcher: Any) -> list | None:
    """LAUNCHER's live list of the local ranks it started (what its watcher thread watches); None as above."""
    return launcher.procs if _SubprocessScriptLauncher and isinstance(launcher, _SubprocessScriptLauncher) else None


def kill_launched(trainer: Trainer, signum: int) -> None:
    trainer.strategy.launcher.kill(signum)


# Resuming (data/base.py, data/streaming.py).


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


def batches_trained(trainer: Trainer) -> int:
    """The batches of the current epoch trained so far by Lightning's count; restored from a checkpoint (before the
    train loader is made), the checkpoint's."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.processed


def shift_batch_count(trainer: Trainer, shift: int) -> None:
    """Moves Lightning's count of the current epoch's batches by SHIFT, on a resume, before the loader's iterator runs.

    Lightning reads a loader's length once as every epoch's (``num_training_batches``) and ends an epoch when its
    count reaches it (its last batch is the one that reaches it: validation, ``is_last_batch``). An epoch resumed on
    another world size has another number of steps left than that length minus the checkpoint's count: the count is
    set so that they agree (the steps left are what the loader yields).
    """
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    for counter in ("ready", "started", "processed", "completed"):
        setattr(current, counter, getattr(current, counter) + shift)  # completed may be -1: reset adds 1


def start_next_epoch_afresh(trainer: Trainer) -> None:
    """After a resume from an epoch's last batch, the next epoch starts as a new one: counted ready and started, its
    ``on_train_epoch_start`` hooks called, its epoch-interval schedulers stepped at its end.

    Lightning's ``_FitLoop.reset`` counts such an epoch processed and completed, but leaves the restart stage "mid
    epoch", so ``on_advance_start`` treats the next epoch as the interrupted one: it neither counts it ready and
    started nor calls its start hooks. A checkpoint at that epoch's last batch then records it as finished (ready =
    started = processed), and a second resume from it trains the whole epoch again (8 extra steps of 24 here).
    """
    fit_loop = trainer.fit_loop
    reset = fit_loop.reset

    def reset_past_last_batch() -> None:
        reset()
        epoch_loop = fit_loop.epoch_loop
        past_last_batch = epoch_loop.restarted_on_train_batch_end and epoch_loop.batch_progress.is_last_batch
        if fit_loop.restarted_mid_epoch and past_last_batch:
            fit_loop._restarting = False  # the fit loop's alone: the epoch loop still restores its batch counters
            fit_loop.reset_restart_stage()

    fit_loop.reset = reset_past_last_batch


# Logging (runs/loggers.py).


class _AppendingExperimentWriter(ExperimentWriter):
    """Keeps an existing ``metrics.csv``: its columns are taken as known, new rows are appended below its rows
    (Lightning's writer deletes the file, which would lose what a resumed run logged before). Counts the rows logged
    (in the file and buffered), and can cut the file back to its first rows (a resume)."""

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


# FSDP2 (runtime/sharding.py).


def set_mesh_sizes(strategy: Any, data_parallel_size: int) -> None:
    """Every rank on ``ModelParallelStrategy``'s data-parallel dimension (its "auto" puts the local ranks on the
    tensor-parallel one, and the public argument cannot say "all ranks" before they are known); set before its
    ``setup_environment`` builds the mesh."""
    strategy._data_parallel_size = data_parallel_size


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
    return _call_and_handle_interrupt(trainer, function, *args, **kwargs)


def install_fork_launcher(trainer: Trainer, launcher_class: type) -> None:
    """Replaces Lightning's script launcher with LAUNCHER_CLASS (built from it) for CPU runs it would start itself."""
    launcher = trainer.strategy.launcher
    if not has(FORKED_RANKS) or not isinstance(trainer.accelerator, CPUAccelerator):
        return
    if type(launcher) is _SubprocessScriptLauncher:
        trainer.strategy._launcher = launcher_class(
            launcher.cluster_environment, launcher.num_processes, launcher.num_nodes
        )


# Callback hooks called on the callbacks that override them only (cli.py).

# Per trainer: its callbacks when last seen (their ids: the callbacks themselves could hold the trainer alive, as a
# progress bar does), and for each hook the positions of the callbacks that override it.
_idle_hooks: "weakref.WeakKeyDictionary[Trainer, tuple[tuple[int, ...], dict[str, tuple[int, ...]]]]" = (
    weakref.WeakKeyDictionary()
)


def skip_idle_callback_hooks(trainer: Trainer) -> None:
    """Lightning calls every callback at each of its hooks, ``Callback``'s empty ones too, each inside a profiler
    context named by the callback's ``state_key``: about 2 µs a call; a digits fit's training step makes 84 (14
    callbacks, 6 hooks), 13 of them overridden. TRAINER then calls each hook on the callbacks that override it only,
    and skips a hook none overrides (Lightning's own loop when it profiles, or keeps or leaves out the monitoring
    callbacks)."""
    if has(NO_IDLE_HOOK_CALLS):
        _idle_hooks[trainer] = ((), {})
        call._call_callback_hooks = _call_overriding


def _overrides(callback: Callback, hook_name: str) -> bool:
    hook = getattr(callback, hook_name, None)
    own = getattr(hook, "__func__", hook) is not getattr(Callback, hook_name, None)  # an instance's own: a function
    return own and callable(hook)  # Lightning's loop skips a hook set to something else (None)


def _overriding(trainer: Trainer, hook_name: str) -> tuple[int, ...]:
    """The positions in ``trainer.callbacks`` of the callbacks that override HOOK_NAME, worked out once for each list
    of callbacks (a callback that gains or drops an override on its instance mid-fit is not seen: none does)."""
    seen, overriding = _idle_hooks[trainer]
    if seen != (ids := tuple(map(id, trainer.callbacks))):
        seen, overriding = ids, {}
        _idle_hooks[trainer] = seen, overriding
    if hook_name not in overriding:
        callbacks = trainer.callbacks
        overriding[hook_name] = tuple(i for i, callback in enumerate(callbacks) if _overrides(callback, hook_name))
    return overriding[hook_name]


def _call_overriding(
    trainer: Trainer, hook_name: str, *args: Any, monitoring_callbacks: bool | None = None, **kwargs: Any
) -> None:
    """Lightning's ``_call_callback_hooks`` without the calls of ``Callback``'s empty hooks and their profiler
    contexts; Lightning's own where it profiles, or picks some callbacks by MONITORING_CALLBACKS."""
    own = trainer in _idle_hooks and isinstance(trainer.profiler, PassThroughProfiler)
    if not own or monitoring_callbacks is not None:
        _call_callback_hooks(trainer, hook_name, *args, monitoring_callbacks=monitoring_callbacks, **kwargs)
        return
    positions = _overriding(trainer, hook_name)
    if not positions:
        return
    callbacks = [trainer.callbacks[position] for position in positions]  # before the calls: one may edit the list
    pl_module = trainer.lightning_module
    if pl_module:
        previous, pl_module._current_fx_name = pl_module._current_fx_name, hook_name
    for callback in callbacks:
        getattr(callback, hook_name)(trainer, pl_module, *args, **kwargs)
    if pl_module:
        pl_module._current_fx_name = previous  # restored when nested, as Lightning's loop does
