"""Training objectives of NaLaDiT (DiT, epsilon) and NaLaSiT (SiT, flow matching), matching our pipeline's modes.

* ``dit``: DDPM forward process with DiT's linear betas (1e-4 .. 0.02, 1000 steps); t ~ U{0..999};
  ``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps``; the model predicts ``eps`` (MSE).
* ``sit``: the linear interpolant in diffusers' convention ``x = (1 - sigma) x_0 + sigma eps`` with sigma ~ U(0, 1)
  (or logit-normal); the model gets ``timestep = 1000 * sigma`` and predicts ``eps - x_0`` (MSE), which is what
  :class:`~nala_gen.diffusion.pipeline.NaLaDiTPipeline` feeds ``FlowMatchEulerDiscreteScheduler``.

All randomness comes from the CPU generator passed in, so a step's loss is a function of (weights, batch, seed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.schedulers import DDPMScheduler, FlowMatchEulerDiscreteScheduler
from diffusers.schedulers.scheduling_utils import SchedulerMixin

NUM_TRAIN_TIMESTEPS = 1000


def drop_labels(labels: torch.Tensor, prob: float, null_class: int, gen: torch.Generator) -> torch.Tensor:
    """Replace each label (B,) by ``null_class`` with probability ``prob`` (classifier-free guidance training)."""
    drop = torch.rand(labels.shape, generator=gen) < prob
    return torch.where(drop.to(labels.device), torch.full_like(labels, null_class), labels)


class EpsilonObjective:
    """DiT: noise prediction under the DDPM linear-beta schedule."""

    name = "dit"
    prediction_type = "epsilon"  # what the model outputs (recorded in the saved transformer's config)

    def __init__(self, clip_sample: bool = True) -> None:
        # Pixels live in [-1, 1], so sampling may clip the x_0 estimate; latents must not be clipped.
        self.noise_scheduler = DDPMScheduler(
            num_train_timesteps=NUM_TRAIN_TIMESTEPS,
            beta_schedule="linear",
            beta_start=1e-4,
            beta_end=0.02,
            prediction_type="epsilon",
            variance_type="fixed_small",
            clip_sample=clip_sample,
        )

    def loss(self, model, x0: torch.Tensor, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """x0 (B, C, H, W) clean data, labels (B,) -> scalar MSE between predicted and true noise."""
        t = torch.randint(0, NUM_TRAIN_TIMESTEPS, (x0.shape[0],), generator=gen).to(x0.device)
        noise = torch.randn(x0.shape, generator=gen).to(x0.device, x0.dtype)
        x_t = self.noise_scheduler.add_noise(x0, noise, t)
        pred = model(x_t, timestep=t, class_labels=labels).sample[:, : x0.shape[1]]
        return F.mse_loss(pred.float(), noise.float())

    def scheduler(self) -> SchedulerMixin:
        """The sampling scheduler saved with the pipeline (swap in DDIM / DPM-Solver with ``from_config``)."""
        return DDPMScheduler.from_config(self.noise_scheduler.config)


class FlowObjective:
    """SiT: velocity ``noise - data`` on the linear path, in diffusers' sigma convention."""

    name = "sit"
    prediction_type = "flow"

    def __init__(self, sigma_sampling: str = "uniform", logit_mean: float = 0.0, logit_std: float = 1.0) -> None:
        self.sigma_sampling, self.logit_mean, self.logit_std = sigma_sampling, logit_mean, logit_std

    def sample_sigma(self, batch: int, gen: torch.Generator) -> torch.Tensor:
        """(B,) sigmas in (0, 1): uniform, or sigmoid of a normal (more weight in the middle, SD3)."""
        if self.sigma_sampling == "logit_normal":
            return torch.sigmoid(torch.randn(batch, generator=gen) * self.logit_std + self.logit_mean)
        return torch.rand(batch, generator=gen)

    def loss(self, model, x0: torch.Tensor, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """x0 (B, C, H, W) clean data, labels (B,) -> scalar MSE between predicted and true ``noise - x0``."""
        sigma = self.sample_sigma(x0.shape[0], gen).to(x0.device)
        noise = torch.randn(x0.shape, generator=gen).to(x0.device, x0.dtype)
        s = sigma.to(x0.dtype)[:, None, None, None]
        x_sigma = (1 - s) * x0 + s * noise
        pred = model(x_sigma, timestep=sigma * NUM_TRAIN_TIMESTEPS, class_labels=labels).sample[:, : x0.shape[1]]
        return F.mse_loss(pred.float(), (noise - x0).float())

    def scheduler(self) -> SchedulerMixin:
        # shift=1: sampling visits the sigmas the model was trained on uniformly in time.
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=NUM_TRAIN_TIMESTEPS, shift=1.0)


def build_objective(name: str, sigma_sampling: str = "uniform", pixel_space: bool = True):
    if name == "dit":
        return EpsilonObjective(clip_sample=pixel_space)
    if name == "sit":
        return FlowObjective(sigma_sampling)
    raise ValueError(f"unknown objective {name!r}; choose dit or sit")
