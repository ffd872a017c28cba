"""Class-labelled image sets for diffusion training, and the per-step sampler that makes resuming exact.

* :class:`DigitsDataset`: scikit-learn's ``load_digits`` (1,797 images, 8x8, 17 gray levels, 10 classes), shipped
  with scikit-learn, so nothing is downloaded; bilinearly upsampled to ``image_size`` and kept in memory.
* :class:`ImageFolderDataset`: ``root/<class name>/<image>`` files, resized (shorter side) and center-cropped to
  ``image_size``, read when a batch needs them.

Both give images in [-1, 1] as (B, C, H, W) float32 tensors and labels as (B,) int64.

:class:`EpochSampler` draws the indices of any batch from ``(seed, position)`` alone: each epoch is a fresh
permutation seeded by ``(seed, epoch)``, so batch ``k`` is the same whether or not the run was interrupted before
it, and no data-loader state needs saving.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nala_gen.fileio import IMAGE_SUFFIXES

from .train_config import DataConfig

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def derived_seed(*keys: int) -> int:
    """A well-mixed 63-bit seed from integers (e.g. seed, step, rank): neighbouring keys give unrelated streams."""
    words = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def generator(*keys: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by :func:`derived_seed`."""
    return torch.Generator().manual_seed(derived_seed(*keys))


class DigitsDataset:
    """scikit-learn's 8x8 digits at ``image_size`` (bilinear), 1 or 3 channels, in [-1, 1]."""

    def __init__(self, image_size: int = 16, channels: int = 1) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        pixels = torch.from_numpy(digits.images).float()[:, None] / 16.0  # (N, 1, 8, 8) in [0, 1]
        if image_size != 8:
            pixels = F.interpolate(pixels, size=(image_size, image_size), mode="bilinear", align_corners=False)
        self.images = (pixels.clamp(0, 1) * 2 - 1).expand(-1, channels, -1, -1).contiguous()
        self.labels = torch.from_numpy(digits.target).long()
        self.id2label = dict(enumerate(DIGIT_NAMES))
        self.description = f"scikit-learn digits ({len(self.labels)} images 8x8 -> {image_size}x{image_size})"

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (B, C, H, W) in [-1, 1] and labels (B,) for dataset ``indices`` (B,)."""
        return self.images[indices], self.labels[indices]


class ImageFolderDataset:
    """``root/<class>/<image>``: classes are the sorted sub-folder names; images are read on demand."""

    def __init__(self, root: str | Path, image_size: int, channels: int = 3) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"data.source {str(root)!r} is neither 'digits' nor a folder")
        classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        self.files: list[tuple[Path, int]] = []
        for label, name in enumerate(classes):
            for path in sorted((root / name).rglob("*")):
                if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                    self.files.append((path, label))
        if not self.files:
            raise ValueError(f"{root} has no class sub-folders with images ({', '.join(IMAGE_SUFFIXES)})")
        self.image_size, self.mode = image_size, "L" if channels == 1 else "RGB"
        self.id2label = dict(enumerate(classes))
        self.labels = torch.tensor([label for _, label in self.files])
        self.description = f"ImageFolder {root} ({len(self.files)} images, {len(classes)} classes)"

    def __len__(self) -> int:
        return len(self.files)

    def load(self, index: int) -> torch.Tensor:
        """One image (C, H, W) in [-1, 1]: shorter side resized to ``image_size`` (bicubic), then center-cropped."""
        from PIL import Image

        path = self.files[index][0]
        with Image.open(path) as img:
            img = img.convert(self.mode)
            scale = self.image_size / min(img.size)
            size = (max(self.image_size, round(img.width * scale)), max(self.image_size, round(img.height * scale)))
            img = img.resize(size, Image.Resampling.BICUBIC)
            left, top = (img.width - self.image_size) // 2, (img.height - self.image_size) // 2
            img = img.crop((left, top, left + self.image_size, top + self.image_size))
            array = np.asarray(img, dtype=np.float32) / 127.5 - 1.0
        return torch.from_numpy(array.reshape(self.image_size, self.image_size, -1)).permute(2, 0, 1)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (B, C, H, W) in [-1, 1] and labels (B,) for dataset ``indices`` (B,)."""
        return torch.stack([self.load(int(i)) for i in indices]), self.labels[indices]


def build_dataset(config: DataConfig) -> DigitsDataset | ImageFolderDataset:
    if config.source == "digits":
        return DigitsDataset(config.image_size, config.channels)
    return ImageFolderDataset(config.source, config.image_size, config.channels)


class EpochSampler:
    """Dataset indices for global sample positions: epoch ``e`` is a permutation seeded by ``(seed, e)``."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:  # one cached epoch: positions are asked for in increasing order
            self._epoch, self._perm = epoch, torch.randperm(self.size, generator=generator(self.seed, epoch))
        return self._perm

    def indices(self, start: int, count: int) -> torch.Tensor:
        """Indices (count,) of positions ``start .. start + count - 1`` (crossing epoch ends as needed)."""
        out, position = [], start
        while position < start + count:
            epoch, offset = divmod(position, self.size)
            take = min(self.size - offset, start + count - position)
            out.append(self._permutation(epoch)[offset : offset + take])
            position += take
        return torch.cat(out)
