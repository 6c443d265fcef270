"""``RunGuard``, the callback the CLI adds to every run (the ``guard`` config key): the safeguards in one place."""

import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

from project.runs.checkpointing import gather_rng_states, restore_rng_states
from project.runs.loggers import drop_rows_after, record_rows
from project.runs.restarts import exit_code_for, record_outcome
from project.runtime.faults import FailFast, NonFiniteLosses, report
from project.runtime.preemption import Interrupted, Preempted, PreemptionCheck
from project.runtime.strategy import process_group_timeout
from project.runtime.throughput import flops_per_sample, peak_flops


class RunGuard(Callback):
    """What the template adds to every run, in one callback: Lightning calls each callback at every hook of every
    step (about six calls a step, a few microseconds each), so one callback instead of five.

    - fail fast (``runtime/faults.py``): on an exception, names the failed rank and stops the ranks it launched;
    - NaN guard (``runtime/faults.py``): stops at a non-finite loss, never saves non-finite weights;
    - RNG states (``runs/checkpointing.py``): every rank's, in each checkpoint, restored on resume;
    - ``metrics.csv`` (``runs/loggers.py``): flushed at each checkpoint, cut back to it on resume;
    - preemption (``runtime/preemption.py``): on SIGTERM, SLURM's requeue signal or Ctrl-C to any rank, every rank
      stops at the same step, last.ckpt is saved (the job requeued on the requeue signal), the run exits 143 (130 on
      Ctrl-C; a second Ctrl-C stops at once without saving);
    - the training loss of each ``log_every_n_steps`` window (``train_loss_step``: the mean of the losses the NaN guard
      keeps), and samples/s (all ranks together) over the window, on the progress bar and in the logs,
      with the model's TFLOP/s and, on GPUs Lightning knows, MFU (``runtime/throughput.py``): Lightning's
      ThroughputMonitor times every step, which needs a CUDA sync per step.

    A training step costs a list append and an addition here; the rest runs every ``log_every_n_steps`` steps
    (NaN check, samples/s) and every ``preemption_check_every_n_steps`` steps (the signal flags' exchange).

    Args:
        preemption_check_every_n_steps: how often the ranks exchange their signal flags. A stop comes at most
            this many steps after the signal: keep steps x this well under the scheduler's grace period.
    """

    def __init__(self, preemption_check_every_n_steps: int = 50) -> None:
        self.fail_fast = FailFast()
        self.preemption = PreemptionCheck(preemption_check_every_n_steps)
        self.non_finite = NonFiniteLosses()
        self._start, self._samples = 0.0, 0
        self._flops_per_sample: int | None = None  # measured at the first step (runtime/throughput.py)
        self._peak_flops: float | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self.preemption.install(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flops_per_sample, self._peak_flops = None, peak_flops(trainer)
        self.fail_fast.heartbeat.start(trainer, process_group_timeout(trainer.strategy))
        self.on_train_epoch_start(trainer, pl_module)  # a mid-epoch resume skips on_train_epoch_start

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start, self._samples = time.perf_counter(), 0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += len(batch[-1])
        self.fail_fast.heartbeat.progressed(trainer.global_step)
        if self._flops_per_sample is None:
            self._measure_flops(trainer, pl_module, batch[0])
        self.non_finite.record(outputs["loss"] if isinstance(outputs, dict) else outputs, trainer)
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self._log_samples_per_second(trainer, pl_module)
        self.preemption.after_step(trainer)

    def _log_samples_per_second(self, trainer: Trainer, pl_module: LightningModule) -> None:
        now = time.perf_counter()
        if trainer.loggers or trainer.progress_bar_callback:  # a self.log call is not cheap: once per window
            if self.non_finite.window_mean is not None:
                pl_module.log("train_loss_step", self.non_finite.window_mean, prog_bar=True, on_step=True)
            samples_per_sec = self._samples * trainer.world_size / (now - self._start)
            pl_module.log("samples_per_sec", samples_per_sec, prog_bar=True, on_step=True)
            if self._flops_per_sample:
                flops_per_sec = samples_per_sec * self._flops_per_sample
                pl_module.log("tflops_per_sec", flops_per_sec / 1e12, on_step=True)
                if self._peak_flops:  # per device, against its peak
                    mfu = flops_per_sec / trainer.world_size / self._peak_flops
                    pl_module.log("mfu", mfu, prog_bar=True, on_step=True)
        self._start, self._samples = now, 0

    def _measure_flops(self, trainer: Trainer, pl_module: LightningModule, inputs: Any) -> None:
        """Counts the model's FLOPs per sample once (on meta tensors) and says them with the step's (all ranks)."""
        measured = flops_per_sample(pl_module, inputs) if isinstance(inputs, torch.Tensor) else None
        self._flops_per_sample = measured or 0  # 0: not measurable, not measured again
        if measured and trainer.is_global_zero:
            per_step = measured * len(inputs) * trainer.world_size
            peak = f", peak {self._peak_flops / 1e12:.0f} TFLOP/s per device" if self._peak_flops else ""
            report(f"model FLOPs (forward and backward): {measured:.3g} per sample, {per_step:.3g} per step{peak}")

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.fail_fast.heartbeat.progressed(trainer.global_step)  # a long validation is not a stall

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.non_finite.check(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.fail_fast.heartbeat.stop()

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self.non_finite.check_weights(trainer, checkpoint["state_dict"])
        checkpoint["rng_states"] = gather_rng_states(trainer)
        record_rows(trainer, checkpoint)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        restore_rng_states(trainer, checkpoint)
        if trainer.state.fn == TrainerFn.FITTING:
            drop_rows_after(trainer, checkpoint)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, Preempted):
            self.preemption.restore_interrupt_handler()
        elif isinstance(exception, (Interrupted, KeyboardInterrupt)):  # Ctrl-C: not a failure
            self.fail_fast.heartbeat.stop()
            self.preemption.stop_at_once(trainer, exception)
        else:
            cause = self.fail_fast.on_exception(trainer, exception)
            record_outcome(exit_code_for(exception), cause)
            self.preemption.restore_interrupt_handler()
