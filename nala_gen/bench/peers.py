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


# Published x4 PSNR/SSIM (Y channel, bicubic degradation) on Set5 and Urban100, as each network's own paper gives
# them, for the README's "published" column; None where no such figure was found. Not measured here.
PUBLISHED_X4: dict[str, dict] = {
    "swinir": {"set5": (32.44, 0.8976), "urban100": (26.47, 0.7980),
               "source": "SwinIR (arXiv 2108.10257), Table 3, lightweight SR, x4 (trained on DIV2K)"},
    "rrdb": {"set5": (32.73, 0.9011), "urban100": (27.03, 0.8153),
             "source": "ESRGAN (arXiv 1809.00219v2), supplementary Table 2, RRDB PSNR-oriented, trained on DF2K"},
    "esrt": {"set5": (32.19, 0.8947), "urban100": (26.39, 0.7962),
             "source": "ESRT (arXiv 2108.11084), x4 as reproduced in later papers' tables; the paper's own table "
                       "was not available here to check against"},
    "edsr": {"set5": None, "urban100": None,
             "source": "EDSR (arXiv 1707.02921) gives its baseline on DIV2K validation only (Table 2: 28.94/0.8963)"},
    "srvgg": {"set5": None, "urban100": None,
              "source": "Real-ESRGAN (arXiv 2107.10833) publishes no bicubic PSNR for its compact (blind SR) model"},
    "nalasr": {"set5": None, "urban100": None,
               "source": "the NaLa paper (arXiv 2506.21137) reports SR memory and latency; no PSNR table was found"},
}  # fmt: skip
