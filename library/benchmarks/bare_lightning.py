"""The bare Lightning Trainer on plain_ddp.py's work: what Lightning itself costs, next to what the template adds.

A LightningModule with only ``training_step`` and ``configure_optimizers``; no logger, progress bar, checkpoint or
model summary; the same network, data module (loader and sampler), batch, steps, seed and optimizer as
``plain_ddp.py`` and the template. Lightning's launcher starts the other processes (``--nprocs``):

    python -m benchmarks.bare_lightning --nprocs 2 --steps 300 --output-dir /tmp

``benchmarks/overhead.py`` races it against both; it times steps with the template's ``StepTimer``.
"""

import argparse
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer, seed_everything
from torch import Tensor, nn

from benchmarks.overhead import StepTimer
from benchmarks.plain_ddp import FILE_PIPELINES, build, file_loader
from benchmarks.plain_ddp import parse_args as plain_args


class BareModule(LightningModule):
    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network
        self.loss_fn = nn.CrossEntropyLoss()

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return self.loss_fn(self.network(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)


class FileData(LightningDataModule):
    """plain_ddp.py's loader over files (image folder or shards) for this rank; Lightning calls its sampler's
    ``set_epoch``, which plain_ddp.py calls by hand."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args

    def train_dataloader(self) -> Any:
        return file_loader(self.args, self.trainer.world_size, self.trainer.global_rank)[0]


def fit(
    args: argparse.Namespace, nprocs: int, callbacks: list[Callback], module_class: type[BareModule] = BareModule
) -> Trainer:
    """Trains plain_ddp.py's network on its data (ARGS: its command line) with a bare Trainer and MODULE_CLASS."""
    seed_everything(args.seed, verbose=False)
    data, network = build(args)
    if args.pipeline in FILE_PIPELINES:
        data = FileData(args)
    trainer = Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=nprocs,
        strategy="ddp" if nprocs > 1 else "auto",
        max_steps=args.steps,
        max_epochs=-1,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        use_distributed_sampler=False,  # the data module's DistributedSampler, as on the other sides
        callbacks=callbacks,
    )
    trainer.fit(module_class(network), datamodule=data)
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--nprocs", type=int, default=1)
    nprocs, rest = parser.parse_known_args()
    args = plain_args(rest)
    fit(args, nprocs.nprocs, [StepTimer(args.output_dir)])
    # Lightning destroys only an NCCL group; left to the interpreter's exit, gloo's threads can abort it (SIGABRT,
    # seen on a 2-process streaming run), as trainfleet/cli.py notes.
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
