"""Test data on disk: the bundled digits written as a real image folder (one PNG per image, one folder per class)."""

from pathlib import Path

from project.data import DigitsDataModule


def write_digit_images(root: Path) -> Path:
    """Writes ROOT/{train,val,test}/<digit>/<n>.png from the template's seeded digits split; returns ROOT."""
    from PIL import Image

    data = DigitsDataModule()
    data.setup("fit")
    for name, split in data.splits.items():
        images, labels = split.tensors
        for label in range(10):
            (root / name / str(label)).mkdir(parents=True)
        for number, (image, label) in enumerate(zip(images, labels, strict=True)):
            pixels = (image[0] * 255).round().byte().numpy()
            Image.fromarray(pixels, mode="L").save(root / name / str(int(label)) / f"{number:04d}.png")
    return root
