"""Named, checksummed weights.

A named weight ``NAME`` is a card ``NAME.json`` in a weights folder beside its payload: ``NAME.safetensors`` for
a network, or a folder ``NAME/`` for a diffusers pipeline. The folders searched, first match wins: those in
``$NALA_GEN_WEIGHTS`` (``os.pathsep``-separated), the user's folder (``$XDG_DATA_HOME/nala_gen/weights``, by
default ``~/.local/share/nala_gen/weights``: where ``nala-sr export`` and ``nala-gen export`` write), and the
weights that ship inside the package (:mod:`nala_gen.resources`). The card holds the task, the architecture
and its config, the payload's sha256, and how the weights were trained (data, iterations, time, the command
that made them).

Nothing is ever unpickled: payloads are safetensors, and BasicSR checkpoints (``.pth``) are read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nala_gen.fileio import PathError, check_readable
from nala_gen.resources import shipped_weights

ENV_DIR = "NALA_GEN_WEIGHTS"


class WeightsError(ValueError):
    """Weights that cannot be found, do not verify, or do not fit the architecture."""


@dataclass
class WeightCard:
    """What a ``NAME.json`` says, plus where its payload lives."""

    name: str
    task: str
    arch: str
    config: dict
    sha256: str
    payload: Path
    info: dict = field(default_factory=dict)

    @property
    def scale(self) -> int | None:
        return self.config.get("upscale")


def user_weights_dir() -> Path:
    """The user's own weights folder: ``$XDG_DATA_HOME/nala_gen/weights`` (``~/.local/share/...`` by default)."""
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "nala_gen" / "weights"


def weights_dirs() -> list[Path]:
    """Folders searched for named weights, in order: ``$NALA_GEN_WEIGHTS``, the user's folder, the shipped ones."""
    dirs = [Path(p) for p in os.environ.get(ENV_DIR, "").split(os.pathsep) if p]
    return [*dirs, user_weights_dir(), shipped_weights()]


def sha256_of(path: Path) -> str:
    """sha256 of a file, or of a folder's files (sorted relative paths and contents). Python's bytecode caches
    (``__pycache__``, which installing a wheel writes beside a folder's ``pipeline.py``) are not content."""
    digest = hashlib.sha256()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.relative_to(path).parts)
    else:
        files = [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def read_card(card_path: Path) -> WeightCard:
    meta = json.loads(card_path.read_text())
    payload = card_path.with_name(meta.get("payload", f"{card_path.stem}.safetensors"))
    return WeightCard(
        name=meta.get("name", card_path.stem),
        task=meta["task"],
        arch=meta["arch"],
        config=meta.get("config", {}),
        sha256=meta.get("sha256", ""),
        payload=payload,
        info=meta.get("info", {}),
    )


def _scan() -> tuple[dict[str, WeightCard], list[tuple[Path, str]]]:
    """(cards by name, the first folder that has a name wins; (path, reason) of each JSON that is no valid card)."""
    cards: dict[str, WeightCard] = {}
    broken: list[tuple[Path, str]] = []
    for folder in weights_dirs():
        if not folder.is_dir():
            continue
        for card_path in sorted(folder.glob("*.json")):
            try:
                card = read_card(card_path)
            except KeyError as err:
                broken.append((card_path, f"no {err.args[0]!r} field"))
                continue
            except (json.JSONDecodeError, UnicodeDecodeError, OSError, AttributeError, TypeError) as err:
                broken.append((card_path, f"unreadable ({type(err).__name__})"))
                continue
            cards.setdefault(card.name, card)
    return cards, broken


def list_weights(task: str | None = None) -> list[WeightCard]:
    """Every named weight (the first folder that has a name wins), optionally of one task."""
    return [c for c in _scan()[0].values() if task is None or c.task == task]


def broken_cards() -> list[tuple[Path, str]]:
    """(path, reason) of each ``*.json`` in the weight folders that is not a valid card, for commands to report."""
    return _scan()[1]


def resolve(name_or_path: str, task: str | None = None) -> WeightCard:
    """A name from :func:`list_weights`, a card path (``.json``), or a payload beside its card. ``task``: what the
    caller runs (``sr``, ``diffusion``), so that an unknown name is answered with that task's names only."""
    path = Path(name_or_path)
    if os.path.lexists(path):  # a path that is there but broken (a symlink loop, a dangling link, no permission)
        check_readable(path)  # is said as such, not as an unknown name
    if path.suffix == ".json" and path.is_dir():
        raise PathError(f"{path}: is a folder, not a file (a weight card)")
    if path.suffix == ".json" and path.is_file():
        return read_card(path)
    if path.exists() and path.with_suffix(".json").is_file():
        return read_card(path.with_suffix(".json"))
    for card in list_weights():
        if card.name == name_or_path:
            return card
    if path.exists():
        raise WeightsError(f"{path} has no weight card {path.with_suffix('.json').name} beside it")
    known = ", ".join(c.name for c in list_weights(task)) or "none installed"
    kind = {"sr": "super-resolution ", "diffusion": "diffusion "}.get(task, "")
    raise WeightsError(f"unknown {kind}weights {name_or_path!r} (known: {known})")


def verify(card: WeightCard) -> None:
    """Check the payload exists and matches the card's sha256."""
    if not card.payload.exists():
        raise WeightsError(f"weights file {card.payload} is missing")
    if card.sha256 and sha256_of(card.payload) != card.sha256:
        raise WeightsError(f"{card.payload} does not match its sha256 (corrupt or replaced file)")


def load_state_dict(card: WeightCard) -> dict[str, torch.Tensor]:
    """Verify and read a network's safetensors payload."""
    from safetensors.torch import load_file

    verify(card)
    try:
        return load_file(str(card.payload))
    except Exception as err:  # safetensors raises its own error types for damaged headers
        raise WeightsError(f"{card.payload} is not a readable safetensors file ({err})") from None


def load_basicsr_checkpoint(path: str | Path, param_key: str | None = None) -> dict[str, torch.Tensor]:
    """A BasicSR ``net_g_*.pth``: ``param_key``, or by default ``params_ema`` when present, else ``params`` (safe,
    weights-only load)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        # torch's own message is many lines and suggests weights_only=False, which this project never does.
        raise WeightsError(
            f"{path} is not a readable PyTorch checkpoint: damaged, or holding objects other than tensors "
            f"(never unpickled here; {type(err).__name__})"
        ) from None
    if not isinstance(checkpoint, dict):
        raise WeightsError(f"{path} does not hold a state dict")
    if param_key is not None:
        if param_key not in checkpoint:
            raise WeightsError(f"{path} has no {param_key!r} (it holds {', '.join(map(str, checkpoint))})")
        return checkpoint[param_key]
    for key in ("params_ema", "params"):
        if key in checkpoint:
            return checkpoint[key]
    return checkpoint


def check_finite(tensors, source: str) -> None:
    """Refuse weights holding NaN or infinity (they give black or noise outputs silently): one-line error naming
    the first such tensor. ``tensors``: ``(name, tensor)`` pairs, e.g. ``state.items()`` or
    ``model.named_parameters()``."""
    for name, tensor in tensors:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise WeightsError(f"{source} holds non-finite values (NaN or inf) in {name}")


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> torch.nn.Module:
    """Strict load with a one-line error naming what does not fit or is not finite."""
    check_finite(state.items(), source)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if expected[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        parts = [
            f"{len(missing)} missing (e.g. {missing[0]})" if missing else "",
            f"{len(unexpected)} unexpected (e.g. {unexpected[0]})" if unexpected else "",
            f"{len(wrong)} of another shape (e.g. {wrong[0]})" if wrong else "",
        ]
        detail = ", ".join(p for p in parts if p)
        raise WeightsError(f"{source} does not match {type(model).__name__}: {detail} tensors")
    model.load_state_dict(state)
    return model


def write_weights(
    state: dict[str, torch.Tensor], folder: Path, name: str, task: str, arch: str, config: dict, info: dict
) -> Path:
    """Save ``NAME.safetensors`` and its card ``NAME.json`` (with the sha256) into ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    payload = folder / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(payload))
    card = {
        "name": name,
        "task": task,
        "arch": arch,
        "config": config,
        "payload": payload.name,
        "sha256": sha256_of(payload),
        "info": info,
    }
    card_path = folder / f"{name}.json"
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    return card_path
