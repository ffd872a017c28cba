"""NaLaSR and ESRT for spandrel, the model loader of chaiNNer and ComfyUI.

    import nala_gen.sr.interop.spandrel_support as nala_spandrel
    nala_spandrel.register()
    model = spandrel.ModelLoader().load_from_file("nalasr-light-x4.safetensors")  # an ImageModelDescriptor
    model.scale  # 4

spandrel detects an architecture from a bare state dict and rebuilds it from the tensors' names and shapes:
feature channels, HPB and transformer counts, scale, image channels, and (NaLaSR) whether the LePE and the
output gate are present. What weights do not record is taken at the paper's value, as every shipped model and
both papers' configs have it: 8 heads, the ``nala`` kernel with RoPE (NaLaSR), 4 EMHA segments (ESRT). A model
trained otherwise loads through ``NaLaSR.from_pretrained`` or its named weights instead, which keep its config.
"""

from __future__ import annotations

import re

from spandrel import MAIN_REGISTRY as SPANDREL_REGISTRY
from spandrel import Architecture, ArchSupport, ImageModelDescriptor, StateDict

from ..archs.esrt_arch import ESRT
from ..archs.nalasr_arch import NaLaSR

_NALA_KEY = "body.transformer.0.attn.block.qkvg.weight"  # the NaLa block's fused q, k, v, g projection
_EMHA_KEY = "body.transformer.0.attn.qkv.weight"
_LAYOUT_KEYS = ("head.weight", "body.reduce.weight", "body.scale_res.scale", "skip.0.weight")


def _count(state: StateDict, prefix: str) -> int:
    """Number of indexed children ``prefix.N.`` in the state dict."""
    found = {int(m.group(1)) for key in state if (m := re.match(rf"{re.escape(prefix)}\.(\d+)\.", key))}
    return max(found) + 1 if found else 0


def _layout(state: StateDict) -> dict:
    """The ESRT-layout arguments the tensors record."""
    num_feat, num_in_ch = state["head.weight"].shape[:2]
    scale, i = 1, 0
    while f"tail.{i + 2}.weight" in state:  # upsampler stages: conv to r^2 x features, pixel shuffle
        scale *= {4: 2, 9: 3}[state[f"tail.{i}.weight"].shape[0] // num_feat]
        i += 2
    return {
        "num_in_ch": int(num_in_ch),
        "num_out_ch": int(state[f"tail.{i}.weight"].shape[0]),
        "num_feat": int(num_feat),
        "num_block": _count(state, "body.hpbs"),
        "num_et": _count(state, "body.transformer"),
        "upscale": scale,
    }


def _descriptor(arch: Architecture, model, state: StateDict, config: dict) -> ImageModelDescriptor:
    return ImageModelDescriptor(
        model,
        state,
        architecture=arch,
        purpose="SR",
        tags=[f"{config['num_feat']}nf", f"{config['num_block']}hpb"],
        supports_half=False,  # the NaLa kernel and ESRT's softmax run their sums in fp32 (autocast is fine)
        supports_bfloat16=True,
        scale=config["upscale"],
        input_channels=config["num_in_ch"],
        output_channels=config["num_out_ch"],
    )


class NaLaSRArch(Architecture[NaLaSR]):
    def __init__(self) -> None:
        super().__init__(id="NaLaSR", name="NaLaSR", detect=lambda s: all(k in s for k in (*_LAYOUT_KEYS, _NALA_KEY)))

    def load(self, state_dict: StateDict) -> ImageModelDescriptor[NaLaSR]:
        config = _layout(state_dict)
        block = "body.transformer.0.attn.block."
        config["lepe"] = f"{block}lepe.weight" in state_dict
        config["gate"] = f"{block}out_norm.weight" in state_dict
        return _descriptor(self, NaLaSR(**config), state_dict, config)


class ESRTArch(Architecture[ESRT]):
    def __init__(self) -> None:
        super().__init__(id="ESRT", name="ESRT", detect=lambda s: all(k in s for k in (*_LAYOUT_KEYS, _EMHA_KEY)))

    def load(self, state_dict: StateDict) -> ImageModelDescriptor[ESRT]:
        config = _layout(state_dict)
        return _descriptor(self, ESRT(**config), state_dict, config)


def register(registry=SPANDREL_REGISTRY) -> None:
    """Add NaLaSR and ESRT to spandrel's registry (the main one by default); calling it again changes nothing."""
    registry.add(
        ArchSupport.from_architecture(NaLaSRArch()),
        ArchSupport.from_architecture(ESRTArch()),
        ignore_duplicates=True,
    )
