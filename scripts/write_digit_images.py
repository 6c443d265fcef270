"""Writes the bundled digits as an image folder (one PNG per image, one folder per class), to try the image-folder
and streaming paths on real files without a download:

    python scripts/write_digit_images.py data/images      # data/images/{train,val,test}/<digit>/<n>.png

The splits are the template's seeded digits split (1,258 / 180 / 359 images), so results compare with the default.
"""

import sys
from pathlib import Path

from project.data import DigitsDataModule


def write_digit_images(root: Path, per_class: int | None = None) -> Path:
    """Writes ROOT/{train,val,test}/<digit>/<n>.png from the template's seeded digits split; returns ROOT.
    PER_CLASS: at most this many images of each digit per split (tiny data for tests)."""
    from PIL import Image

    data = DigitsDataModule()
    data.setup("fit")
    for name, split in data.splits.items():
        images, labels = split.tensors
        for label in range(10):
            (root / name / str(label)).mkdir(parents=True)
        written = dict.fromkeys(range(10), 0)
        for number, (image, label) in enumerate(zip(images, labels, strict=True)):
            if per_class is not None and written[int(label)] == per_class:
                continue
            written[int(label)] += 1
            pixels = (image[0] * 255).round().byte().numpy()
            Image.fromarray(pixels, mode="L").save(root / name / str(int(label)) / f"{number:04d}.png")
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(f"wrote {write_digit_images(Path(sys.argv[1]))}")
