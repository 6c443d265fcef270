"""Your callbacks: the place for what a run should do beside training (log, plot, stop early, save extra files).

A callback is a ``lightning.pytorch.Callback`` with the hooks it needs; a config lists it under
``trainer.callbacks`` (``configs/grad_norm.yaml``), beside the callbacks every run gets (trainfleet/cli.py).
A later ``--config`` whose ``trainer.callbacks`` is a list replaces this list: name every callback the run wants in
one list. The template's own (fail-fast, NaN guard, throughput, resume state, preemption: ``add_safeguards`` in
cli.py) are machinery, in ``runtime/`` and ``runs/``.
"""

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.optim import Optimizer


class GradientNorm(Callback):
    """Logs ``grad_norm``, the L2 norm of all gradients together (what ``gradient_clip_val`` would clip), every
    ``trainer.log_every_n_steps`` optimizer steps: a run whose norm grows step after step is heading for a NaN.

    Measured after the gradients are averaged across ranks and unscaled (mixed precision), before the optimizer step;
    the same on every rank. Under FSDP2 each rank holds a shard of each gradient, and the norm is gathered.
    """

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer) -> None:
        # Lightning writes step metrics after the step that makes global_step a multiple: log only then (cheaper).
        if (trainer.global_step + 1) % trainer.log_every_n_steps == 0:
            pl_module.log("grad_norm", total_norm(pl_module), on_step=True, on_epoch=False)


def total_norm(module: torch.nn.Module) -> torch.Tensor:
    """The L2 norm of every gradient of MODULE taken together (0 when none has a gradient)."""
    gradients = [parameter.grad for parameter in module.parameters() if parameter.grad is not None]
    if not gradients:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(gradients)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a sharded (DTensor) norm: every rank's part
