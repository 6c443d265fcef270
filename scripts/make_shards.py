"""Writes a data module's train/val/test splits as LitData shards, for ``trainfleet.data.StreamingDataModule``.

    python scripts/make_shards.py --data project.data.DigitsDataModule --output data/shards/digits
    python scripts/make_shards.py --data trainfleet.data.ImageFolderDataModule --data.root data/images \\
        --data.grayscale true --output data/shards/images
    python scripts/make_shards.py ... --output s3://bucket/shards/images   # straight to object storage

Any data module of this project works (``--data`` takes its class path and arguments, as in a config): the splits
are the module's own (its folders, or its seeded split), stored untransformed: each item is
``{"image": <PIL image or tensor>, "label": <int>}``; the streaming module applies its configured transforms when it
reads them. ``OUTPUT/{train,val,test}/`` get the shards (``litdata.optimize``), ``OUTPUT/dataset.json`` the class
names (``num_classes``) and the sample counts.
"""

import json
import sys
from functools import partial
from pathlib import Path

import fsspec
import torch
from jsonargparse import ArgumentParser
from torch.utils.data import Dataset
from trainfleet.data import BaseDataModule
from trainfleet.data.base import SPLITS
from trainfleet.data.streaming import SCHEMA_FILE
from trainfleet.data.transforms import Transformed


def item(dataset: Dataset, index: int) -> dict:
    image, label = dataset[index]
    return {"image": image, "label": int(label)}


def write_shards(data: BaseDataModule, output: str, chunk_bytes: str, num_workers: int, seed: int) -> dict:
    """Optimizes every split into OUTPUT/<split>/ and writes OUTPUT/dataset.json; returns what it wrote there.

    Items are written in a seeded random order: LitData shuffles chunks and items within a few chunks, so chunks
    written class by class (as an image folder lists them) would make whole batches of one class.
    """
    import litdata

    data.setup("fit")
    counts = {}
    for name in SPLITS:
        split = data.splits[name]
        raw = split.dataset if isinstance(split, Transformed) else split  # stored untransformed
        litdata.optimize(
            fn=partial(item, raw),
            inputs=torch.randperm(len(raw), generator=torch.Generator().manual_seed(seed)).tolist(),
            output_dir=f"{output.rstrip('/')}/{name}",
            chunk_bytes=chunk_bytes,
            num_workers=num_workers,
            mode="overwrite",
            start_method="fork",  # the workers inherit the loaded data instead of importing and loading it again
            verbose=False,
        )
        counts[name] = len(raw)
    classes = getattr(data.datasets()["train"], "classes", None) or [str(label) for label in range(data.num_classes)]
    meta = {"classes": list(classes), "samples": counts}
    with fsspec.open(f"{output.rstrip('/')}/{SCHEMA_FILE}", "w") as file:
        json.dump(meta, file, indent=2)
    return meta


def main() -> int:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_subclass_arguments(BaseDataModule, "data", required=True, help="the data module to convert")
    parser.add_argument("--output", required=True, help="a local folder or an object-store URL (s3://...)")
    parser.add_argument("--chunk_bytes", default="64MB", help="size of each shard file")
    parser.add_argument("--num_workers", type=int, default=1, help="processes that write shards")
    parser.add_argument("--seed", type=int, default=0, help="seeds the order items are written in")
    config = parser.parse_args()
    data = parser.instantiate(config).data
    if not config.output.startswith(("s3://", "gs://", "azure://")):
        Path(config.output).mkdir(parents=True, exist_ok=True)
    meta = write_shards(data, config.output, config.chunk_bytes, config.num_workers, config.seed)
    print(f"wrote {meta['samples']} samples of {len(meta['classes'])} classes to {config.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
