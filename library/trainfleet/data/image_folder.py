"""A folder of images, one folder per class, read with torchvision's ``ImageFolder`` (the ``vision`` extra).

torchvision is imported when the module is built, so the package works without it.
"""

from functools import partial
from pathlib import Path

from torch.utils.data import Dataset

from trainfleet.data.base import SPLITS, BaseDataModule
from trainfleet.data.transforms import presets
from trainfleet.data.unreadable import refuse_or_skip
from trainfleet.messages import first_line


class ImageFolderDataModule(BaseDataModule):
    """Images in ``root/train/<class>/*.png`` (and optionally ``root/val/``, ``root/test/``), or in
    ``root/<class>/*`` split into train/val/test by ``val_fraction``/``test_fraction``.

    ``num_classes`` (the class folders) and ``input_shape`` (one transformed image) are read from the data when
    the module is built, so a missing folder or a class without images stops the run before any process starts.
    Standard presets build the transforms; ``train_transforms``/``eval_transforms`` replace them when given.

    Args:
        root: the image folder.
        image_size: resize the shorter side to this size, then center-crop a square (``None``: keep the size;
            every image must then have the same size).
        crop_padding: training augmentation: pad by this many pixels, then crop back at a random place (0: none).
        horizontal_flip: training augmentation: flip half of the images left to right.
        grayscale: read images as one channel (``False``: RGB, three channels).
        mean, std: normalize each channel (``None``: pixel values scaled to [0, 1]).
        skip_unreadable: train without the images that cannot be read (``False``: refuse them, listed, before the
            first step). Each file's header is checked, and a PNG's every chunk: a JPEG cut short passes and fails
            when a worker reads it, naming the file. ``predict`` decodes each input first and carries on past any.
        **kwargs: the ``BaseDataModule`` arguments (batch_size, num_workers, transforms, ...).
    """

    def __init__(
        self,
        root: str,
        image_size: int | None = None,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        grayscale: bool = False,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        skip_unreadable: bool = False,
        **kwargs,
    ) -> None:
        # kwargs go on to super().__init__ as they are: jsonargparse follows them there for the accepted keys.
        train, evaluate = presets(image_size, crop_padding, horizontal_flip, mean, std)
        kwargs["train_transforms"] = kwargs.get("train_transforms") or train
        kwargs["eval_transforms"] = kwargs.get("eval_transforms") or evaluate
        super().__init__(**kwargs)
        self.mode = "L" if grayscale else "RGB"
        self.folders = image_folders(Path(root), self.mode)
        paths = [path for folder in self.folders.values() for path, _ in folder.samples]
        problems = unreadable_images(paths, decode=False)
        refuse_or_skip(problems, len(paths), f"images under {root}", skip_unreadable)
        leave_out(self.folders, problems)
        if image_size is None:
            check_one_size(self.folders)
        self.discover(self.folders["train"])
        if self.hparams.predict_path is not None:  # a folder without images is refused before anything runs
            image_files(Path(self.hparams.predict_path))

    def datasets(self) -> dict[str, Dataset]:
        return self.folders

    def read_inputs(self, path: Path) -> tuple[Dataset, list[str]]:
        """Every image file under ``path`` (a folder, searched recursively, or one image) that can be read, in path
        order; the others in ``unreadable_inputs``, with the reason."""
        files = image_files(path)
        problems = unreadable_images([str(file) for file in files], decode=True)
        self.unreadable_inputs = list(problems.items())
        readable = [file for file in files if str(file) not in problems]
        return ImageFiles(readable, self.mode), [str(file) for file in readable]


def image_files(path: Path) -> list[Path]:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix.lower() in IMG_EXTENSIONS)
    if not files:
        raise ValueError(f"predict_path {path} holds no image ({', '.join(IMG_EXTENSIONS)})")
    return files


def unreadable_images(paths: list[str], decode: bool) -> dict[str, str]:
    """The PATHS that cannot be read, with why: each file decoded (DECODE), or its header and a PNG's chunk checksums
    checked (``verify``: about half a decode's time, and no pixels kept)."""
    from PIL import Image, UnidentifiedImageError

    problems = {}
    for path in paths:
        try:
            with Image.open(path) as image:
                image.load() if decode else image.verify()
        except UnidentifiedImageError:
            problems[path] = "not an image PIL can read"
        except (OSError, SyntaxError, ValueError) as error:  # verify raises SyntaxError for a broken PNG chunk
            problems[path] = first_line(error) or type(error).__name__
    return problems


def leave_out(folders: dict[str, Dataset], problems: dict[str, str]) -> None:
    """Drops the images in PROBLEMS from each ``ImageFolder`` (its samples, and their alias and targets)."""
    if not problems:
        return
    for folder in folders.values():
        folder.samples = [sample for sample in folder.samples if sample[0] not in problems]
        folder.imgs, folder.targets = folder.samples, [target for _, target in folder.samples]


class ImageFiles(Dataset):
    """``(image, 0)`` for each file: new images to predict, without labels."""

    def __init__(self, files: list[Path], mode: str) -> None:
        self.files, self.mode = files, mode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple:
        return load_image(str(self.files[index]), self.mode), 0


def image_folders(root: Path, mode: str) -> dict[str, Dataset]:
    """``ImageFolder`` per split found under ``root``: ``train``/``val``/``test`` folders, or ``root`` as ``train``."""
    from torchvision.datasets import ImageFolder

    if not root.is_dir():
        raise ValueError(f"image folder not found: {root}")
    layout = {name: root / name for name in SPLITS if (root / name).is_dir()} or {"train": root}
    if "train" not in layout:
        raise ValueError(f"{root} has {sorted(layout)} folders but no train/ folder")
    folders = {}
    for name, path in layout.items():
        try:
            folders[name] = ImageFolder(str(path), loader=partial(load_image, mode=mode))
        except FileNotFoundError as error:  # no class folder, or a class folder without images
            raise ValueError(f"{path}: {error}") from error
        if folders[name].classes != folders["train"].classes:
            raise ValueError(
                f"{path} has the classes {folders[name].classes}, {layout['train']} has {folders['train'].classes}"
            )
    return folders


def check_one_size(folders: dict[str, Dataset]) -> None:
    """Refuses images of different sizes, which cannot be batched without ``image_size``: here, naming two of them,
    rather than in a loader worker mid-epoch. Reads each file's header only (about 20 us an image)."""
    from PIL import Image

    first: tuple[str, tuple[int, int]] | None = None
    for folder in folders.values():
        for path, _ in folder.samples:
            try:
                with Image.open(path) as image:
                    size = image.size
            except OSError:  # load_image names it, when a worker reads it
                continue
            if first is None:
                first = path, size
            elif size != first[1]:
                raise ValueError(
                    f"images of different sizes: {first[0]} is {first[1][0]}x{first[1][1]}, {path} is"
                    f" {size[0]}x{size[1]}; give --data.init_args.image_size N to resize every image (shorter side"
                    " to N, then a center crop of N x N)"
                )


def load_image(path: str, mode: str):
    """Reads one image in ``mode`` (``L`` or ``RGB``); an unreadable file is named in the error."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.convert(mode)
    except OSError as error:
        raise OSError(f"cannot read image {path}: {error}") from error
