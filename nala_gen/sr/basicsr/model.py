"""``UpscalerSRModel``: BasicSR's ``SRModel`` whose validation pass runs through nala_gen's upscaler.

BasicSR's ``SRModel.test`` runs the network on each whole validation image. That is right for NaLaSR (linear in
the pixels), but ESRT's softmax attention over a 640x400 LR picture (the photo set's held-out split) asks for
tens of GB, so a run validating ESRT on real photographs ends at its first validation. Here each validation image
goes through :class:`~nala_gen.sr.upscale.engine.Upscaler` with ``tile="auto"``: whole where the pass fits the memory
budget (NaLaSR, every image of the mini set), otherwise in blended tiles, exactly as ``nala-sr evaluate`` and
``nala-sr upscale`` score and run the same weights. Training is BasicSR's own. Select it with
``model_type: UpscalerSRModel`` in an option file (importing :mod:`nala_gen.sr.basicsr` registers it).
``val: memory_budget_mb`` fixes the validation's budget (default: half of the host's available memory, which two
runs validating at the same time would each claim).

The upscaler takes and returns 8-bit pictures, as BasicSR's metrics do (``tensor2img``): the LR tensor, read from
an 8-bit file, is turned back into its bytes, and the output comes back as bytes / 255, so the scores equal
``SRModel``'s for a whole-image pass up to the inference graph's float32 rounding.

Two training options, measured by ``nala-bench train-speed`` (docs: results/training.md), under ``train:``:

* ``channels_last: true``: the network and each batch in channels-last (NHWC), oneDNN's native layout on the CPU;
  the same arithmetic in another memory order;
* ``autocast: bf16 | auto | fp32``: the network's forward under ``torch.autocast("cpu", torch.bfloat16)`` (the
  loss on its output promoted to fp32; weights, gradients and Adam's state stay fp32); ``auto`` is bf16 where the
  CPU computes it natively (AVX512_BF16 or AMX) and fp32 elsewhere, where emulated bf16 is slower than fp32. The
  log says which ran.

``path: pretrain_network_g`` may also name a ``.safetensors`` file (a shipped ``weights/NAME.safetensors``: one
network's state dict, so ``param_key_g`` does not apply to it and is ignored; ``strict_load_g`` holds as given), read
with safetensors; a ``.pth`` loads as BasicSR loads it.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from basicsr.models.sr_model import SRModel

from ..upscale.engine import Upscaler, budget_bytes


def training_precision(setting: str) -> str:
    """``train: autocast`` -> the precision a step runs at: ``bf16`` or ``fp32`` (``auto``: bf16 where native)."""
    from nala_gen.devices import cpu_native_bf16

    if setting not in ("fp32", "bf16", "auto"):
        raise ValueError(f"train: autocast must be fp32, bf16 or auto, not {setting!r}")
    if setting == "auto":
        return "bf16" if torch.cuda.is_available() or cpu_native_bf16() else "fp32"
    return setting


class UpscalerSRModel(SRModel):
    """``SRModel`` with a memory-budgeted validation pass (whole image where it fits, blended tiles where not) and
    the training options ``channels_last`` and ``autocast`` (module docstring)."""

    _engine: Upscaler | None = None  # the validation's, built once per validation run

    def __init__(self, opt: dict) -> None:
        train = opt.get("train") or {} if opt.get("is_train") else {}
        self._layout = torch.channels_last if train.get("channels_last") else torch.contiguous_format
        self._precision = training_precision(str(train.get("autocast", "fp32")))
        super().__init__(opt)
        if opt.get("is_train"):
            from basicsr.utils import get_root_logger

            for net in (self.net_g, getattr(self, "net_g_ema", None)):
                if net is not None:
                    net.to(memory_format=self._layout)
            layout = "channels-last" if self._layout is torch.channels_last else "contiguous"
            get_root_logger().info(f"Training steps: {layout} tensors, {self._precision} forward.")

    def feed_data(self, data: dict) -> None:
        super().feed_data(data)
        self.lq = self.lq.contiguous(memory_format=self._layout)
        if hasattr(self, "gt"):
            self.gt = self.gt.contiguous(memory_format=self._layout)

    def optimize_parameters(self, current_iter: int) -> None:
        """BasicSR's step (forward, losses, backward, optimiser, EMA), the network's forward autocast to bf16 when
        asked: PyTorch's pattern, autocast around the forward only, so the loss (the output promoted to fp32), the
        backward and the optimiser run as they would in fp32."""
        if self._precision != "bf16":
            return super().optimize_parameters(current_iter)
        net, device_type = self.net_g, self.device.type
        layers = net.forward

        def forward(*args, **kwargs):
            with torch.autocast(device_type, dtype=torch.bfloat16):
                return layers(*args, **kwargs)

        net.forward = forward  # for this step's one call of self.net_g(self.lq); the EMA update still sees the module
        try:
            super().optimize_parameters(current_iter)
        finally:
            del net.forward

    def _make_engine(self) -> Upscaler:
        net = self.net_g_ema if hasattr(self, "net_g_ema") else self.net_g
        # A copy: the upscaler puts its network in eval mode and channels-last, which must not reach the
        # weights being trained (nor their optimiser state).
        budget = budget_bytes((self.opt.get("val") or {}).get("memory_budget_mb"))
        return Upscaler(
            copy.deepcopy(net), self.opt["scale"], device=str(self.device), precision="fp32", memory_budget=budget
        )

    def load_network(self, net, load_path, strict=True, param_key="params") -> None:
        """BasicSR's ``load_network``; a ``.safetensors`` path is read with safetensors (``param_key`` ignored: the
        file holds one network's state dict)."""
        if not str(load_path).endswith(".safetensors"):
            return super().load_network(net, load_path, strict, param_key)
        from basicsr.utils import get_root_logger
        from safetensors.torch import load_file

        net = self.get_bare_model(net)
        state = load_file(str(load_path), device="cpu")
        state = {k.removeprefix("module."): v for k, v in state.items()}
        get_root_logger().info(f"Loading {net.__class__.__name__} model from {load_path} (safetensors).")
        self._print_different_keys_loading(net, state, strict)
        net.load_state_dict(state, strict=strict)

    def nondist_validation(self, dataloader, current_iter, tb_logger, save_img) -> None:
        """BasicSR's validation loop, with one engine (copy, inference graph, memory probes) for all its images."""
        self._engine = self._make_engine()
        try:
            super().nondist_validation(dataloader, current_iter, tb_logger, save_img)
        finally:
            self._engine = None

    def test(self) -> None:
        """``self.output`` (1, 3, sH, sW) in [0, 1] for ``self.lq`` (1, 3, H, W) in [0, 1], from 8-bit pictures."""
        engine = self._engine or self._make_engine()
        outputs = []
        for lq in self.lq:
            img = (lq.permute(1, 2, 0).clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
            out, _ = engine.upscale(np.ascontiguousarray(img))
            outputs.append(torch.from_numpy(out).permute(2, 0, 1).float().div(255))
        self.output = torch.stack(outputs).to(self.device)
