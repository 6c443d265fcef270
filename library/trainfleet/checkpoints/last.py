"""``last.ckpt`` written now, on every rank's call, outside ModelCheckpoint's own triggers: at a preemption stop
(runtime/preemption.py) and when the periodic checkpoint is due (periodic.py)."""

import os

from lightning.pytorch import Trainer


def save_last_checkpoint(trainer: Trainer) -> None:
    """Saves ``last.ckpt`` on every rank's call (rank 0 writes, then all wait), as ModelCheckpoint's ``save_last``."""
    callback = trainer.checkpoint_callback
    if callback is None or callback.dirpath is None:
        trainer.strategy.barrier("preempted")
        return
    path = os.path.join(callback.dirpath, callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION)
    callback.last_model_path = path  # before saving: it is part of the callback's saved state
    trainer.save_checkpoint(path, callback.save_weights_only)
