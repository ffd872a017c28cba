"""NaLaDiT's pipeline for diffusers' generic loader (written by nala_gen; the code is in the package)."""

from nala_gen.diffusion.pipeline import NaLaDiTPipeline  # noqa: F401
