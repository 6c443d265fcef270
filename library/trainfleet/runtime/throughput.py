"""``Throughput``: samples/s (all ranks together) over each ``log_every_n_steps`` window, on the progress bar and in
the logs, with the model's TFLOP/s and, on GPUs Lightning knows, model FLOPs utilisation (MFU).

The FLOPs of one sample's forward and backward pass are counted by torch's ``FlopCounterMode`` on meta tensors
(shapes only: no compute, no memory, no random numbers drawn, so exact resume is unaffected). The peak comes from
Lightning's table of known GPUs for the run's compute dtype (``bf16-mixed``: bfloat16); on a CPU or an unknown GPU
there is none, and no MFU is logged. Lightning's ``ThroughputMonitor`` would do this with a CUDA sync per step; here a
step costs an addition, and the rest runs once per window.
"""

import time
from typing import Any

import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from trainfleet.messages import report

# The dtype each precision setting computes in, by its first part ("bf16-mixed", "16-true", "32", ...).
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "32": torch.float32, "64": torch.float64}


def flops_per_sample(network: nn.Module, inputs: Tensor) -> int | None:
    """FLOPs of a forward and backward pass of NETWORK on one sample shaped like a row of INPUTS; None when the
    network cannot run on meta tensors (e.g. sharded by FSDP)."""
    if any(hasattr(parameter, "to_local") for parameter in network.parameters()):
        return None  # sharded (FSDP2): running it on meta tensors would disturb its hooks' state
    tensors = [*network.named_parameters(), *network.named_buffers()]
    meta = {name: torch.empty_like(t, device="meta").requires_grad_(t.requires_grad) for name, t in tensors}
    sample = torch.empty((1, *inputs.shape[1:]), dtype=inputs.dtype, device="meta")
    try:
        with FlopCounterMode(display=False) as counter:
            functional_call(network, meta, (sample,)).sum().backward()
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None
    return counter.get_total_flops()


def peak_flops(trainer: Trainer) -> float | None:
    """The device's theoretical peak FLOPs/s at the run's compute dtype; None on CPUs and on GPUs Lightning does
    not know."""
    device, dtype = trainer.strategy.root_device, COMPUTE_DTYPES.get(str(trainer.precision).split("-")[0])
    if device.type != "cuda" or dtype is None:
        return None
    return get_available_flops(device, dtype)


class Throughput(Callback):
    """Logs ``samples_per_sec``, ``tflops_per_sec`` and ``mfu`` once per ``log_every_n_steps`` window; says the model's
    FLOPs before the first step."""

    def __init__(self) -> None:
        self._start, self._samples = 0.0, 0
        self._flops_per_sample: int | None = None  # measured at the first step
        self._peak_flops: float | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flops_per_sample, self._peak_flops = None, peak_flops(trainer)
        self.on_train_epoch_start(trainer, pl_module)  # a mid-epoch resume skips on_train_epoch_start

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start, self._samples = time.perf_counter(), 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._flops_per_sample is None:  # the first step's batch, on its device
            self._measure_flops(trainer, pl_module, batch[0])

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += len(batch[-1])
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self._log(trainer, pl_module)

    def _log(self, trainer: Trainer, pl_module: LightningModule) -> None:
        now = time.perf_counter()
        if trainer.loggers or trainer.progress_bar_callback:  # a self.log call is not cheap: once per window
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
