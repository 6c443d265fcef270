"""``ResumeState``: what a checkpoint holds beyond Lightning's own for an exact resume, and what a resume undoes.

- every rank's RNG states (``files.py``), saved in each checkpoint and restored when ``fit`` resumes:
  Lightning's checkpoints hold none, so dropout and random augmentation would otherwise draw other numbers;
- the ``metrics.csv`` rows logged so far (``loggers.py``), flushed at each checkpoint and counted in it; a resumed fit
  drops the rows the interrupted attempt logged after it, and logs them again.
"""

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

from trainfleet.checkpoints.files import gather_rng_states, restore_rng_states
from trainfleet.runs.loggers import drop_rows_after, record_rows


class ResumeState(Callback):
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = gather_rng_states(trainer)  # a collective: every rank saves
        record_rows(trainer, checkpoint)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        restore_rng_states(trainer, checkpoint)
        if trainer.state.fn == TrainerFn.FITTING:
            drop_rows_after(trainer, checkpoint)
