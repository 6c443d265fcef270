"""Callbacks the CLI always adds: the run's safeguards, and files every run should leave behind."""

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from project.checkpointing import gather_rng_states, restore_rng_states
from project.faults import FailFast, NonFiniteLosses, report
from project.overhead import skip_empty_batch_hooks, skip_idle_checkpoint_hooks
from project.preemption import Preempted, PreemptionCheck
from project.throughput import flops_per_sample, peak_flops


class TestMetricsWriter(Callback):
    """Writes the final test metrics to ``<log_dir>/test_metrics.json`` and prints them.

    ``trainer.callback_metrics`` already holds the values reduced across all ranks.
    """

    def __init__(self, filename: str = "test_metrics.json") -> None:
        self.filename = filename

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_dir = trainer.log_dir or trainer.default_root_dir  # log_dir broadcasts: every rank calls it
        if not trainer.is_global_zero:
            return
        metrics = {name: value.item() for name, value in trainer.callback_metrics.items()}
        path = Path(log_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        print(f"test metrics written to {path}: {json.dumps(metrics, sort_keys=True)}")


class PredictionsWriter(BasePredictionWriter):
    """Writes ``predict``'s outputs to ``<log_dir>/predictions.csv`` as ``index,prediction`` rows.

    Each rank predicts its own shard; the shards are gathered once and put back in data set order
    using the shard's sampler indices (Lightning's ``batch_indices`` exist only for DataLoaders).
    """

    def __init__(self, filename: str = "predictions.csv") -> None:
        super().__init__(write_interval="epoch")
        self.filename = filename

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: LightningModule, predictions: Sequence[Any], batch_indices: Any
    ) -> None:
        log_dir = trainer.log_dir or trainer.default_root_dir  # log_dir broadcasts: every rank calls it
        shard = (list(trainer.predict_dataloaders.sampler), torch.cat(list(predictions)).tolist())
        shards = [shard]
        if dist.is_available() and dist.is_initialized():
            shards = [None] * dist.get_world_size()
            dist.all_gather_object(shards, shard)
        if not trainer.is_global_zero:
            return
        rows = sorted(row for indices, preds in shards for row in zip(indices, preds, strict=True))
        path = Path(log_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("index,prediction\n" + "".join(f"{index},{pred}\n" for index, pred in rows))
        print(f"{len(rows)} predictions written to {path}")


class RunGuard(Callback):
    """What the template adds to every run, in one callback: Lightning calls each callback at every hook of every
    step (about six calls a step, a few microseconds each), so one callback instead of five.

    - fail fast (``project/faults.py``): on an exception, names the failed rank and stops the ranks it launched;
    - NaN guard (``project/faults.py``): stops at a non-finite loss, never saves non-finite weights;
    - RNG states (``project/checkpointing.py``): every rank's, in each checkpoint, restored on resume;
    - preemption (``project/preemption.py``): on SIGTERM to any rank, every rank stops at the same step, last.ckpt
      is saved, the run exits 143;
    - samples/s (all ranks together) on the progress bar and in the logs, over each ``log_every_n_steps`` window,
      with the model's TFLOP/s and, on GPUs Lightning knows, MFU (``project/throughput.py``): Lightning's
      ThroughputMonitor times every step, which needs a CUDA sync per step.

    A training step costs a list append and an addition here; the rest runs every ``log_every_n_steps`` steps
    (NaN check, samples/s) and every ``preemption_check_every_n_steps`` steps (the SIGTERM flags' exchange).

    Args:
        preemption_check_every_n_steps: how often the ranks exchange their SIGTERM flags. A stop comes at most
            this many steps after the signal: keep steps x this well under the scheduler's grace period.
    """

    def __init__(self, preemption_check_every_n_steps: int = 50) -> None:
        self.fail_fast = FailFast()
        self.preemption = PreemptionCheck(preemption_check_every_n_steps)
        self.non_finite = NonFiniteLosses()
        self._start, self._samples = 0.0, 0
        self._flops_per_sample: int | None = None  # measured at the first step (project/throughput.py)
        self._peak_flops: float | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        skip_empty_batch_hooks(trainer)  # the final callback list: the model's own callbacks are in it by now
        skip_idle_checkpoint_hooks(trainer.callbacks)
        if stage == "fit":
            self.preemption.install(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flops_per_sample, self._peak_flops = None, peak_flops(trainer)
        self.on_train_epoch_start(trainer, pl_module)  # a mid-epoch resume skips on_train_epoch_start

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start, self._samples = time.perf_counter(), 0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += len(batch[-1])
        if self._flops_per_sample is None:
            self._measure_flops(trainer, pl_module, batch[0])
        self.non_finite.record(outputs["loss"] if isinstance(outputs, dict) else outputs, trainer)
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self._log_samples_per_second(trainer, pl_module)
        self.preemption.after_step(trainer)

    def _log_samples_per_second(self, trainer: Trainer, pl_module: LightningModule) -> None:
        now = time.perf_counter()
        if trainer.loggers or trainer.progress_bar_callback:  # a self.log call costs about a millisecond
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

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.non_finite.check(trainer)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self.non_finite.check_weights(trainer, checkpoint["state_dict"])
        checkpoint["rng_states"] = gather_rng_states(trainer)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        restore_rng_states(trainer, checkpoint)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, Preempted):
            self.fail_fast.on_exception(trainer, exception)
