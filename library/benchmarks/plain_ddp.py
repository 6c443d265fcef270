"""The hand-written PyTorch DDP training script this template replaces; benchmarks/overhead.py races the two.

One process per rank, torchrun style (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT from the environment):

    torchrun --nproc-per-node 2 -m benchmarks.plain_ddp --steps 300 --output-dir /tmp

It trains what ``python -m project fit --config configs/digits.yaml`` trains (same split, sampler, seed, initial
weights, optimizer; no scheduler, no validation) and each rank writes its timings and final loss as JSON.
"""

import argparse
import hashlib
import json
import os
import resource
import time
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import torch
import torch.distributed as dist
from project.data import DigitsDataModule
from project.networks import MLP, SmallCNN
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from trainfleet.data import InMemoryDataModule
from trainfleet.data.loaders import TensorBatchLoader

LAST_STEPS = 5  # the final loss is the mean loss of the last steps (a single step's loss is noisy)
LAUNCH_TIME = "BENCH_LAUNCH_TIME"  # the launcher's time.time(), to measure time to first step
SYNTHETIC_IMAGES = 4096


class SyntheticImages(InMemoryDataModule):
    """Random CIFAR-sized images (3x32x32, 10 classes) held in memory, the same on every side (``split_seed``)."""

    num_classes = 10
    input_shape = (3, 32, 32)

    def load(self) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.hparams.split_seed)
        images = torch.randn(SYNTHETIC_IMAGES, *self.input_shape, generator=generator)
        return images, torch.randint(0, self.num_classes, (SYNTHETIC_IMAGES,), generator=generator)


def build(args: argparse.Namespace) -> tuple[InMemoryDataModule, nn.Module]:
    """The data module and the network (seeded as the template's CLI: seed, then build) for --network."""
    data_class = SyntheticImages if args.network == "cnn" else DigitsDataModule
    data = data_class(batch_size=args.batch_size, seed=args.seed, in_memory=args.pipeline == "in-memory")
    torch.manual_seed(args.seed)
    if args.network == "cnn":
        return data, SmallCNN(data.num_classes, data.input_shape)
    return data, MLP(data.num_classes, data.input_shape, tuple(args.hidden_sizes))


def weights_digest(module: nn.Module) -> str:
    """A hash of all parameters: equal digests mean bit-identical initial weights."""
    data = b"".join(p.detach().cpu().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def rank_stats(start: float, end: float, first_step_unix: float, steps: int, samples: int, losses: Iterable) -> dict:
    """What every rank reports: both sides of the benchmark call this, so they measure the same way."""
    return {
        "seconds": end - start,
        "steps": steps,
        "samples": samples,
        "time_to_first_step_s": first_step_unix - float(os.environ.get(LAUNCH_TIME, first_step_unix)),
        "loss": torch.stack(list(losses)).mean().item(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "gpu_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else 0.0,
    }


def write_rank_stats(stats: dict[str, Any], output_dir: str) -> None:
    """Each rank writes its own ``rank<N>.json``; the benchmark combines them (no collective at the end)."""
    rank = dist.get_rank() if dist.is_initialized() else 0  # bare Lightning's single process has no group
    with open(os.path.join(output_dir, f"rank{rank}.json"), "w") as file:
        json.dump(stats, file, indent=2)


def endless(loader: Iterable, sampler: DistributedSampler | None) -> Iterator:
    """Batches epoch after epoch; set_epoch reshuffles, the same way on every rank."""
    epoch = 0
    while True:
        if sampler is not None:  # LitData's loader reshuffles by itself
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


FILE_PIPELINES = ("image-folder", "streaming")


def to_tensor(image: Any) -> torch.Tensor:
    """PIL image (or tensor) to float CxHxW in [0, 1]."""
    from torchvision.transforms.v2.functional import to_dtype, to_image

    return to_dtype(to_image(image), torch.float32, scale=True)


def grayscale(path: str) -> Any:
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("L")


def shard_item(item: dict) -> tuple[torch.Tensor, int]:
    return to_tensor(item["image"]), item["label"]


def file_loader(args: argparse.Namespace, world_size: int, rank: int) -> tuple[Iterable, DistributedSampler | None]:
    """The classic loaders over files: torchvision's ImageFolder with a DataLoader, or LitData's streaming loader."""
    workers = {"num_workers": args.num_workers, "persistent_workers": args.num_workers > 0}
    if args.pipeline == "image-folder":
        from torchvision.datasets import ImageFolder

        train = ImageFolder(os.path.join(args.data_root, "train"), transform=to_tensor, loader=grayscale)
        sampler = DistributedSampler(train, world_size, rank, shuffle=True, seed=args.seed)
        return DataLoader(train, batch_size=args.batch_size, sampler=sampler, **workers), sampler
    from litdata import StreamingDataLoader, StreamingDataset

    shards = StreamingDataset(os.path.join(args.data_root, "train"), shuffle=True, seed=args.seed, transform=shard_item)
    generator = torch.Generator().manual_seed(args.seed)
    return StreamingDataLoader(shards, batch_size=args.batch_size, generator=generator, **workers), None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--seed", type=int, default=42, help="initial weights and training order")
    parser.add_argument("--pipeline", choices=("dataloader", "in-memory", *FILE_PIPELINES), default="dataloader")
    parser.add_argument("--data-root", help="image-folder: train/<class>/*.png under it; streaming: train/ shards")
    parser.add_argument("--num-workers", type=int, default=0, help="loader workers per rank (file pipelines)")
    parser.add_argument("--network", choices=("mlp", "cnn"), default="mlp", help="cnn: SmallCNN on synthetic images")
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=[128, 64], help="of the MLP")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--output-dir", default=".", help="where each rank writes rank<N>.json")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    rank, world_size, local_rank = (int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    device = torch.device(args.device, local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and all_gather_object use the current device
    # MASTER_ADDR and MASTER_PORT are read from the environment (init_method "env://").
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)

    data, network = build(args)
    data.setup("fit")  # the template's train/val/test split
    train = data.splits["train"]
    sampler = DistributedSampler(train, world_size, rank, shuffle=True, seed=args.seed)
    if args.pipeline in FILE_PIPELINES:
        loader, sampler = file_loader(args, world_size, rank)
    elif args.pipeline == "dataloader":
        loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    else:
        loader = TensorBatchLoader(train.tensors, sampler, args.batch_size)
    init_digest = weights_digest(network)
    model = DistributedDataParallel(network.to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    losses: deque = deque(maxlen=LAST_STEPS)  # tensors, so no step waits for a .item()
    samples = 0
    for step, (x, y) in enumerate(islice(endless(loader, sampler), args.steps)):
        if step == 0:
            start, first_step_unix = time.perf_counter(), time.time()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()
        losses.append(loss.detach())
        samples += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize()  # the last step has really finished
    end = time.perf_counter()

    stats = rank_stats(start, end, first_step_unix, args.steps, samples, losses)
    write_rank_stats({**stats, "init_digest": init_digest}, args.output_dir)
    dist.destroy_process_group()
    # Leave without freeing the DDP model: with gloo (torch 2.13) its destructor can deadlock, joining gloo's
    # worker thread while holding the GIL that the thread needs to free the last gradient all-reduce.
    os._exit(0)


if __name__ == "__main__":
    main()
