"""The super-resolution networks people already run, as BasicSR 1.4.2 ships them, at their papers' x4 settings.

One place for their configurations, used by the peer board (``nala-bench peers``) and the equal-budget
trainings (``nala-bench sr-ablation --variants srvgg edsr swinir``). Each entry: BasicSR arch name and its
keyword arguments without the scale (RRDBNet names it ``scale``, the others ``upscale``).
"""

from __future__ import annotations

PEERS: dict[str, tuple[str, dict]] = {
    # Real-ESRGAN's compact net (realesr-general-x4v3's layout): 64 channels, 32 convs, PReLU; 1.21 M params
    "srvgg": ("SRVGGNetCompact", {"num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_conv": 32,
                                  "act_type": "prelu"}),
    # EDSR-baseline: 16 residual blocks of 64 channels, residual scale 1; 1.52 M params
    "edsr": ("EDSR", {"num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_block": 16, "res_scale": 1,
                      "img_range": 255.0, "rgb_mean": [0.4488, 0.4371, 0.4040]}),
    # SwinIR-light: dim 60, 4 x 6 blocks, window 8, pixel-shuffle-direct upsampler; 0.93 M params
    "swinir": ("SwinIR", {"in_chans": 3, "img_size": 64, "window_size": 8, "img_range": 1.0, "depths": [6, 6, 6, 6],
                          "embed_dim": 60, "num_heads": [6, 6, 6, 6], "mlp_ratio": 2, "upsampler": "pixelshuffledirect",
                          "resi_connection": "1conv"}),
    # ESRGAN's RRDBNet (RealESRGAN_x4plus): 23 RRDB blocks, 64 channels; 16.7 M params
    "rrdb": ("RRDBNet", {"num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_block": 23, "num_grow_ch": 32}),
}  # fmt: skip


def peer_network(name: str, scale: int = 4) -> dict:
    """A BasicSR ``network_g`` for the peer: {"type": arch, ...its settings, scale}."""
    arch, config = PEERS[name]
    return {"type": arch, **config, ("scale" if arch == "RRDBNet" else "upscale"): scale}
