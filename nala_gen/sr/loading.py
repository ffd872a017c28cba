"""Super-resolution networks from named weights, weight cards or BasicSR checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

from nala_gen import weights as W

DEFAULT_MODELS = {2: "nalasr-light-x2", 4: "nalasr-light-x4"}


def build_arch(arch: str, config: dict) -> torch.nn.Module:
    """One of our archs (torch only), or else one of BasicSR's own (SwinIR, EDSR, ...: imports BasicSR)."""
    from . import SR_ARCHS

    cls = SR_ARCHS.get(arch)
    if cls is None:
        from .basicsr import registry  # basicsr and its archs, ours registered

        try:
            cls = registry.ARCH_REGISTRY.get(arch)
        except KeyError:
            raise W.WeightsError(f"unknown architecture {arch!r}") from None
    try:
        return cls(**config)
    except TypeError as err:  # a field the arch does not take (e.g. a card written for an older version)
        raise W.WeightsError(f"the config does not fit {arch}: {err}") from None


def network_from_option(option: str | Path) -> tuple[str, dict]:
    """(arch, config) from a BasicSR option file's ``network_g``."""
    import yaml  # here: an upscale of a named model never reads an option file (yaml's import is 17 ms)

    network = dict(yaml.safe_load(Path(option).read_text())["network_g"])
    return network.pop("type"), network


def load_sr_model(
    model: str | None, scale: int | None, option: str | Path | None = None
) -> tuple[torch.nn.Module, dict]:
    """The network and a description of it, from a name, a card/safetensors path, or a BasicSR ``.pth``.

    Args:
        model: name (``nala-sr models``), weight card or payload path, or a BasicSR checkpoint (needs ``option``);
            None picks the default model for ``scale``.
        scale: the scale asked for; a model of another scale is an error (None: the model's own; x4 by default).
        option: BasicSR option file describing a ``.pth`` checkpoint's network.
    """
    if model is None:
        scale = scale or 4
        if scale not in DEFAULT_MODELS:
            raise W.WeightsError(
                f"no default model for x{scale}; defaults exist for x{', x'.join(map(str, DEFAULT_MODELS))}"
            )
        model = DEFAULT_MODELS[scale]
    if Path(model).suffix == ".pth":
        if option is None:
            raise W.WeightsError("a BasicSR .pth checkpoint needs --opt OPTION.yml to describe its network")
        arch, config = network_from_option(option)
        state, source = W.load_basicsr_checkpoint(model), str(model)
        info = {"name": Path(model).name, "arch": arch, "source": source}
    else:
        card = W.resolve(model, task="sr")
        if card.task != "sr":
            raise W.WeightsError(f"{card.name} is a {card.task} model, not a super-resolution one")
        arch, config = card.arch, card.config
        state, source = W.load_state_dict(card), card.name
        info = {"name": card.name, "arch": arch, "source": str(card.payload), "sha256": card.sha256, **card.info}
    model_scale = config.get("upscale", 4)
    if scale is not None and model_scale != scale:
        raise W.WeightsError(f"{info['name']} upscales x{model_scale}, not x{scale}")
    net = W.load_into(build_arch(arch, config), state, source)
    return net.eval(), {**info, "scale": model_scale}


def export_checkpoint(
    checkpoint: str | Path, option: str | Path, name: str, out_dir: str | Path, info: dict, param_key: str | None = None
) -> Path:
    """BasicSR checkpoint + option file -> named weights (safetensors + card) in ``out_dir``; ``param_key`` picks
    ``params`` or ``params_ema`` (default: the EMA ones when present)."""
    arch, config = network_from_option(option)
    state = W.load_basicsr_checkpoint(checkpoint, param_key)
    W.load_into(build_arch(arch, config), state, str(checkpoint))  # refuse to export a mismatch
    return W.write_weights(state, Path(out_dir), name, "sr", arch, config, info)
