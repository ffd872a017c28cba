"""An honest quality check for digit generators: a classifier trained on the real digits judges the samples.

* The classifier (a small CNN) is trained by this command itself, seeded, on 80 % of scikit-learn's digits at the
  generator's resolution; its accuracy on the other 20 % is reported with the results.
* Class-conditional accuracy: ``per_class`` samples of every class, the share the classifier assigns to the class
  they were asked for.
* Fréchet distance between the classifier's penultimate features of the samples and of all real digits (the FID
  recipe with this classifier in place of Inception; lower is better, the real held-out digits give the floor).
* A second judge, independent of the first, so that a generator is not tuned to one classifier: scikit-learn's
  RBF support-vector classifier on the original 8x8 digits (the library's own digits example: ``gamma=0.001``,
  trained on the first half of the digits in their stored order), reading the samples area-averaged back to 8x8
  and 17 gray levels. Another model family, another input, another split, no gradient descent; its held-out
  accuracy is taken on the second half after the same round trip the samples make (upsampled as the generator
  saw them, then averaged back).

    nala-gen quality -m naladit-digits [--per-class 100] [--steps 50] [--cfg 2] [--json benchmarks/results/...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nala_gen.fileio import update_json

from .data import DigitsDataset


class DigitClassifier(nn.Module):
    """Two conv blocks and a 64-d feature layer; (B, C, S, S) in [-1, 1] -> logits (B, 10), features (B, 64)."""

    def __init__(self, channels: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
            nn.Linear(256, 64), nn.ReLU(),
        )  # fmt: skip
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return self.head(features), features


def train_classifier(
    image_size: int, channels: int, seed: int = 0, epochs: int = 30, data: DigitsDataset | None = None
) -> tuple[DigitClassifier, float, torch.Tensor]:
    """Train on 80 % of the real digits; return the classifier, its held-out accuracy and the held-out indices.

    ``data``: the digits at ``image_size``/``channels`` if the caller already has them (built otherwise).
    """
    data = DigitsDataset(image_size, channels) if data is None else data
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data), generator=gen)
    split = int(0.8 * len(data))
    train_idx, test_idx = order[:split], order[split:]
    torch.manual_seed(seed)
    model = DigitClassifier(channels)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(epochs):
        for batch in train_idx[torch.randperm(split, generator=gen)].split(64):
            images, labels = data.batch(batch)
            # Small shifts make the classifier judge shapes, not exact pixel positions.
            images = torch.roll(images, shifts=tuple(torch.randint(-1, 2, (2,), generator=gen).tolist()), dims=(2, 3))
            loss = F.cross_entropy(model(images)[0], labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        images, labels = data.batch(test_idx)
        accuracy = (model(images)[0].argmax(1) == labels).float().mean().item()
    return model, accuracy, test_idx


SVC_GAMMA = 0.001  # scikit-learn's digits example


def to_digit_grid(images: torch.Tensor) -> np.ndarray:
    """(B, C, S, S) in [-1, 1] -> (B, 64) on scikit-learn's 8x8 digit grid, gray levels 0..16 (area average over
    pixels and channels)."""
    gray = images.float().mean(1, keepdim=True)
    grid = F.adaptive_avg_pool2d(gray, 8) if gray.shape[-1] != 8 else gray
    return ((grid.clamp(-1, 1) + 1) * 8).flatten(1).numpy()


def train_second_judge(data: DigitsDataset) -> tuple[object, float]:
    """The SVC judge trained on the first half of the digits (8x8, as stored); returns it and its accuracy on the
    second half read from ``data``'s images (at the generator's size) through :func:`to_digit_grid`."""
    from sklearn.datasets import load_digits
    from sklearn.svm import SVC

    digits = load_digits()
    half = len(digits.images) // 2
    judge = SVC(gamma=SVC_GAMMA).fit(digits.data[:half], digits.target[:half])
    held_out = torch.arange(half, len(digits.images))
    images, labels = data.batch(held_out)
    accuracy = float((judge.predict(to_digit_grid(images)) == labels.numpy()).mean())
    return judge, accuracy


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to feature sets a (N, D) and b (M, D)."""
    from scipy import linalg

    mu_a, mu_b = a.mean(0), b.mean(0)
    # A tiny ridge keeps the matrix square root well defined: ReLU features that never fire make the
    # covariances singular (the offset the FID reference code falls back to; it moves the result by ~1e-5).
    ridge = np.eye(a.shape[1]) * 1e-6
    cov_a, cov_b = np.cov(a, rowvar=False) + ridge, np.cov(b, rowvar=False) + ridge
    covmean = linalg.sqrtm(cov_a @ cov_b)
    covmean = covmean.real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * covmean))


def evaluate(
    pipe, per_class: int, steps: int, cfg: float, seed: int = 0, batch: int = 250, classifier_epochs: int = 30
) -> dict:
    """Accuracy and Fréchet distance of ``pipe``'s samples (pixel-space digits pipeline)."""
    size = pipe.transformer.config.sample_size
    channels = pipe.transformer.config.in_channels
    real = DigitsDataset(size, channels)
    classifier, held_out, held_out_idx = train_classifier(size, channels, seed, classifier_epochs, data=real)
    labels = torch.arange(10).repeat_interleave(per_class)
    samples = []
    pipe.set_progress_bar_config(disable=True)
    start = time.perf_counter()
    for i, chunk in enumerate(labels.split(batch)):
        generator = torch.Generator().manual_seed(seed * 1000 + i)
        out = pipe(chunk.tolist(), num_inference_steps=steps, guidance_scale=cfg, generator=generator,
                   output_type="pt").images  # fmt: skip
        samples.append(out * 2 - 1)  # pipeline gives [0, 1]; the classifier reads [-1, 1]
    seconds = time.perf_counter() - start
    samples = torch.cat(samples)
    with torch.no_grad():
        logits, sample_features = classifier(samples)
        _, real_features = classifier(real.images)
    held_out_features = real_features[held_out_idx]
    accuracy = (logits.argmax(1) == labels).float().mean().item()
    second_judge, second_held_out = train_second_judge(real)
    second = torch.from_numpy(second_judge.predict(to_digit_grid(samples)))
    return {
        "classifier_held_out_accuracy": held_out,
        "samples": len(labels),
        "steps": steps,
        "guidance_scale": cfg,
        "accuracy": accuracy,
        "per_class_accuracy": [(logits.argmax(1)[labels == c] == c).float().mean().item() for c in range(10)],
        "svc_held_out_accuracy": second_held_out,
        "svc_accuracy": (second == labels).float().mean().item(),
        "svc_per_class_accuracy": [(second[labels == c] == c).float().mean().item() for c in range(10)],
        "frechet_distance": frechet_distance(sample_features.numpy(), real_features.numpy()),
        # The same distance for real digits the classifier never trained on: what a perfect generator would get
        # with this many images (the estimate is biased upwards for small sets).
        "frechet_distance_real_held_out": frechet_distance(held_out_features.numpy(), real_features.numpy()),
        "sampling_seconds": seconds,
        "attention": attention_settings(pipe.transformer.config),
    }


def attention_settings(config) -> dict:
    """What the samples' attention was: the kernel, its options and the NaLa block's parts (read from the model)."""
    return {key: config.get(key) for key in ("kernel", "kernel_options", "rope", "lepe", "gate")}


def main(argv: list[str] | None = None) -> int:
    from .loading import load_pipeline, new_scheduler

    parser = argparse.ArgumentParser(prog="nala-gen quality", description=__doc__.split("\n")[0])
    parser.add_argument("-m", "--model", required=True, help="pipeline folder or named weights")
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--cfg", type=float, default=2.0)
    parser.add_argument("--scheduler", help="as in nala-gen sample (default: the pipeline's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="add the result under the model's name in this file")
    args = parser.parse_args(argv)
    pipe, _ = load_pipeline(args.model)
    if args.scheduler:
        pipe.scheduler = new_scheduler(pipe, args.scheduler)
    result = evaluate(pipe, args.per_class, args.steps, args.cfg, args.seed)
    print(json.dumps(result, indent=1))
    if args.json:
        update_json(args.json, args.model, result)
    return 0
