"""Third-party warnings and log lines a run would print, silenced by message and module for the versions known to
emit them: the main command prints no warning (tests/test_quiet.py), and a new version's warnings are seen again."""

import functools
import importlib.metadata
import logging
import warnings
from collections.abc import Callable

# (message, module that warns, package, its versions known to emit it).
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
