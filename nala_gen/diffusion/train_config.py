"""The training configuration of ``nala-gen train``: dataclasses read from YAML, with ``key=value`` overrides.

A config file is a plain mapping (see ``options/diffusion/*.yml``)::

    output_dir: experiments/naladit_digits
    objective: dit            # dit (epsilon, DDPM linear betas) or sit (flow matching, noise - data)
    model: {size: tiny, hidden_size: 128, depth: 4, kernel: nala}
    data: {source: digits, image_size: 16, channels: 1}
    batch_size: 64
    max_steps: 4000

Overrides use dotted keys and YAML values: ``model.kernel=softmax``, ``lr=3e-4``, ``vae=null``. The model's older
key names (``attention_kernel``, ``attention_kernel_options``, ``attention_type``) still load, with a
DeprecationWarning, under today's (``kernel``, ``kernel_options``).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import yaml

OBJECTIVES = ("dit", "sit")
MIXED_PRECISION = ("no", "bf16", "fp16")
SIGMA_SAMPLING = ("uniform", "logit_normal")


@dataclass
class DataConfig:
    """What to train on.

    Attributes:
        source: ``digits`` (scikit-learn's 8x8 digits, embedded) or the path of an ImageFolder (one sub-folder of
            images per class).
        image_size: side in pixels after resizing (digits: bilinear upsampling; folders: resize + center crop).
        channels: 1 (gray) or 3 (RGB).
        hflip: random horizontal flips (off by default: flipped digits are other glyphs).
    """

    source: str = "digits"
    image_size: int = 16
    channels: int = 1
    hflip: bool = False


@dataclass
class TrainConfig:
    """Everything one training run needs.

    Attributes:
        output_dir: run folder: ``checkpoints/step_N``, ``log.jsonl``, ``config.yml``, ``pipeline/`` (the result)
            and ``training_info.json``.
        objective: ``dit`` (epsilon prediction, DDPM linear betas 1e-4..2e-2 over 1000 steps) or ``sit`` (flow
            matching: ``x = (1 - sigma) * data + sigma * noise``, target ``noise - data``, timestep ``1000 * sigma``).
        model: ``{"size": NAME, **overrides}`` for :meth:`NaLaDiTTransformer2DModel.from_size` (e.g. ``kernel``,
            ``kernel_options``); ``sample_size``, ``in_channels`` and ``num_classes`` follow from the data (and the
            VAE) when not given.
        data: see :class:`DataConfig`.
        vae: optional local diffusers ``AutoencoderKL`` folder: train on ``latents * scaling_factor``.
        batch_size: per process and per micro-batch; the effective batch is ``batch_size * grad_accum * processes``.
        grad_accum: micro-batches per optimizer step.
        lr, weight_decay, warmup_steps, max_grad_norm: AdamW with a linear warm-up, gradient-norm clipping (0: off).
        max_steps: optimizer steps in all (a resumed run continues to this number).
        mixed_precision: ``no``, ``bf16`` or ``fp16`` (forced to ``no`` on CPU).
        class_dropout_prob: probability that a label is replaced by the null class (for classifier-free guidance).
        sigma_sampling: ``sit`` only: ``uniform`` sigma ~ U(0, 1) (SiT's choice) or ``logit_normal`` (SD3's).
        ema_decay: EMA of the weights (the saved pipeline uses it); null disables.
        checkpoint_every, keep_checkpoints: checkpoint period in steps and how many to keep.
        log_every: period of the ``log.jsonl`` lines.
        seed: model initialisation and the per-step data / noise streams.
        cpu: train on the CPU even where an accelerator exists.
    """

    output_dir: str = "experiments/naladit"
    objective: str = "dit"
    model: dict = field(default_factory=lambda: {"size": "tiny"})
    data: DataConfig = field(default_factory=DataConfig)
    vae: str | None = None
    batch_size: int = 64
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    max_steps: int = 1000
    mixed_precision: str = "no"
    class_dropout_prob: float = 0.1
    sigma_sampling: str = "uniform"
    ema_decay: float | None = 0.999
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    cpu: bool = False

    def validate(self) -> TrainConfig:
        """Raise ``ValueError`` naming the first bad field; returns self."""
        from .model import MODEL_SIZES, NaLaDiTTransformer2DModel

        checks = [
            (self.objective in OBJECTIVES, f"objective must be one of {OBJECTIVES}, got {self.objective!r}"),
            (self.mixed_precision in MIXED_PRECISION, f"mixed_precision must be one of {MIXED_PRECISION}"),
            (self.sigma_sampling in SIGMA_SAMPLING, f"sigma_sampling must be one of {SIGMA_SAMPLING}"),
            (self.data.channels in (1, 3), f"data.channels must be 1 or 3, got {self.data.channels}"),
            (self.data.image_size > 0, "data.image_size must be positive"),
            (
                min(self.batch_size, self.grad_accum, self.max_steps) > 0,
                "batch_size, grad_accum, max_steps must be > 0",
            ),
            (self.checkpoint_every > 0 and self.log_every > 0, "checkpoint_every and log_every must be > 0"),
            (self.keep_checkpoints > 0, "keep_checkpoints must be > 0"),
            (0 <= self.class_dropout_prob < 1, "class_dropout_prob must be in [0, 1)"),
            (self.ema_decay is None or 0 <= self.ema_decay < 1, "ema_decay must be in [0, 1) or null (no EMA)"),
            (self.lr > 0, "lr must be positive"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        size = self.model.get("size", "tiny")
        if size not in MODEL_SIZES:
            raise ValueError(f"model.size must be one of {', '.join(MODEL_SIZES)}, got {size!r}")
        known = set(inspect.signature(NaLaDiTTransformer2DModel.__init__).parameters) - {"self"}
        unknown = sorted(set(self.model) - known - {"size"})
        if unknown:
            raise ValueError(f"unknown model field(s) {', '.join(unknown)}; known: size, {', '.join(sorted(known))}")
        if self.model.get("learn_sigma"):
            # A learned variance needs DiT's variational-bound loss term, which this trainer does not implement.
            raise ValueError("model.learn_sigma: true is not supported by this trainer (MSE only); set it to false")
        return self

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _coerce(name: str, kind: str, value):
    """Numbers YAML 1.1 reads as strings (``1e-3`` without a dot) -> the field's type; anything else is checked."""
    base = kind.replace(" | None", "")
    if value is None and kind.endswith("| None"):
        return None
    if base in ("int", "float") and isinstance(value, str):
        try:
            value = float(value) if base == "float" else int(value)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {value!r}") from None
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(base, True)
    if not ok:
        raise ValueError(f"{name} must be {base}, got {value!r}")
    return float(value) if base == "float" else value


def _build(cls, values: dict, where: str):
    """A dataclass from a mapping, refusing unknown keys (typos must not be silently ignored)."""
    if not isinstance(values, dict):
        raise ValueError(f"{where or 'the config'} must be a mapping, got {type(values).__name__}")
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown {where + ' ' if where else ''}field(s) {', '.join(unknown)}; known: {sorted(fields)}"
        )
    prefix = f"{where}." if where else ""
    return cls(**{k: _coerce(prefix + k, str(fields[k]), v) for k, v in values.items()})


def _set_dotted(tree: dict, key: str, value) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"override {key!r}: {part!r} is not a mapping")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, object]:
    """``"model.depth=4"`` -> ``("model.depth", 4)`` (the value is read as YAML)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} is not key=value")
    return key.strip(), yaml.safe_load(value) if value.strip() else None


def config_from_dict(raw: dict, overrides: list[str] = ()) -> TrainConfig:
    """Apply ``overrides`` to a raw mapping and build a validated :class:`TrainConfig`.

    Deprecated model keys move to today's names, the file's before the overrides apply (so ``model.kernel=...``
    overrides an old file's ``attention_kernel``) and each override's own key too."""
    from nala_gen.attention.modules import with_kernel_keys

    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (raw or {}).items()}
    if isinstance(raw.get("model"), dict):
        raw["model"] = with_kernel_keys(raw["model"])
    for text in overrides:
        key, value = parse_override(text)
        if key.startswith("model."):
            renamed = with_kernel_keys({key.removeprefix("model."): value})
            if not renamed:  # a deprecated key set to null: nothing to set
                continue
            ((name, value),) = renamed.items()
            key = f"model.{name}"
        _set_dotted(raw, key, value)
    data = _build(DataConfig, raw.pop("data", {}) or {}, "data")
    model = raw.pop("model", None) or {"size": "tiny"}
    if not isinstance(model, dict):
        raise ValueError("model must be a mapping such as {size: tiny, depth: 4}")
    config = _build(TrainConfig, {**raw, "data": data, "model": with_kernel_keys(model)}, "")
    return config.validate()


def load_config(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML config file and apply ``key=value`` overrides."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    return config_from_dict(yaml.safe_load(path.read_text()) or {}, overrides)
