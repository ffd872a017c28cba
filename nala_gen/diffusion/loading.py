"""Loading NaLaDiT pipelines and choosing their schedulers: what ``nala-gen``, the app and the benchmarks share.

A pipeline comes from a folder (``model_index.json``) or a named weight (task ``diffusion``, sha256 checked),
with its weights checked for non-finite values. Schedulers are chosen by short name from one table; only those
of the model's objective are allowed (epsilon-prediction DiT: DDPM, DDIM, DPM-Solver; flow-matching SiT:
FlowMatch Euler and Heun).
"""

from __future__ import annotations

from pathlib import Path

# Short name -> diffusers scheduler class name.
SCHEDULERS = {
    "ddpm": "DDPMScheduler",
    "ddim": "DDIMScheduler",
    "dpm": "DPMSolverMultistepScheduler",
    "euler": "FlowMatchEulerDiscreteScheduler",
    "heun": "FlowMatchHeunDiscreteScheduler",
}
EPSILON_SCHEDULERS = ("ddpm", "ddim", "dpm")
FLOW_SCHEDULERS = ("euler", "heun")


def load_pipeline(spec: str):
    """A :class:`NaLaDiTPipeline` from a pipeline folder or a verified named weight (task ``diffusion``).

    Returns:
        (pipeline, display name)
    """
    from nala_gen.weights import WeightsError, resolve, verify

    path = Path(spec)
    if path.is_dir() and (path / "model_index.json").is_file():
        return _from_pretrained(path), str(path)
    card = resolve(spec, task="diffusion")
    if card.task != "diffusion":
        raise WeightsError(f"{card.name} holds {card.task!r} weights, not a diffusion pipeline")
    if not (card.payload / "model_index.json").is_file():
        raise WeightsError(f"{card.payload} is not a diffusers pipeline folder")
    verify(card)
    return _from_pretrained(card.payload), card.name


def _from_pretrained(folder: Path):
    from diffusers.utils import logging

    from nala_gen.weights import check_finite

    from .pipeline import NaLaDiTPipeline

    # diffusers' "Loading pipeline components" bar would bury the one line a CLI user needs on stderr.
    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        pipe = NaLaDiTPipeline.from_pretrained(folder)
    finally:
        if enabled:
            logging.enable_progress_bar()
    for name in ("transformer", "vae"):
        component = getattr(pipe, name, None)
        if component is not None:
            check_finite(component.state_dict().items(), f"{folder} ({name})")
    return pipe


def scheduler_names(pipe) -> tuple[str, ...]:
    """The short names of the schedulers that fit the model's objective (recorded, else the saved scheduler's)."""
    return FLOW_SCHEDULERS if pipe.prediction_type == "flow" else EPSILON_SCHEDULERS


def scheduler_key(scheduler) -> str | None:
    """The short name of a scheduler instance (None for one outside the table)."""
    return {cls: key for key, cls in SCHEDULERS.items()}.get(type(scheduler).__name__)


def new_scheduler(pipe, name: str, base=None):
    """A new scheduler ``name`` built from ``base``'s config (default: the pipeline's own); the pipeline is not
    changed. ValueError when it does not fit the model's objective."""
    import diffusers

    allowed = scheduler_names(pipe)
    if name not in allowed:
        kind = "a flow-matching (SiT)" if pipe.prediction_type == "flow" else "an epsilon (DiT)"
        raise ValueError(f"scheduler {name!r} does not fit {kind} model; use {', '.join(allowed)}")
    return getattr(diffusers, SCHEDULERS[name]).from_config((base or pipe.scheduler).config)


def parse_classes(text: str, pipe) -> list[int]:
    """``all``, or comma-separated class ids and/or names -> class ids (ValueError for unknown ones)."""
    if text.strip().lower() == "all":
        return list(range(pipe.transformer.config.num_classes))
    items: list[int | str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise ValueError(f"empty class in {text!r}")
        if not item.lstrip("+-").isdigit() and item.lower() not in pipe.labels:
            known = ", ".join(pipe.id2label.values()) or "none: this model has no class names, use ids"
            raise ValueError(f"unknown class name {item!r} (known: {known})")
        items.append(int(item) if item.lstrip("+-").isdigit() else item)
    return pipe.get_label_ids(items)
