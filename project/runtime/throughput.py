"""Model FLOPs, measured once, and the GPU's peak: FLOPs/s and model FLOPs utilisation (MFU) beside samples/s.

The FLOPs of one sample's forward and backward pass are counted by torch's ``FlopCounterMode`` on meta tensors
(shapes only: no compute, no memory, no random numbers drawn, so exact resume is unaffected). The peak comes from
Lightning's table of known GPUs for the run's compute dtype (``bf16-mixed``: bfloat16); on a CPU or an unknown GPU
there is none, and no MFU is logged. Lightning's ``ThroughputMonitor`` would do this with a CUDA sync per step.
"""

import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch import Trainer
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

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
