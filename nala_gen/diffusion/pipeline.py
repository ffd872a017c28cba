"""``NaLaDiTPipeline``: class-conditional sampling with a NaLaDiT, as DiT (epsilon) or SiT (flow matching).

The mode follows the scheduler:

* DiT / epsilon prediction with ``DDPMScheduler``, ``DDIMScheduler``, ``DPMSolverMultistepScheduler`` (any
  non-flow scheduler): the transformer predicts the noise at the scheduler's timestep in [0, 1000). A learned
  sigma is handed to the scheduler only where it uses it (``DDPMScheduler`` with ``variance_type`` ``learned`` or
  ``learned_range``); otherwise the first ``in_channels`` channels are used.
* SiT / flow matching with ``FlowMatchEulerDiscreteScheduler`` or ``FlowMatchHeunDiscreteScheduler``. Our
  convention is diffusers' (not SiT's): ``x_sigma = (1 - sigma) * data + sigma * noise``, the transformer is fed
  ``timestep = 1000 * sigma`` (the scheduler's timesteps) and outputs the velocity ``noise - data`` directly, so
  the scheduler steps on it unchanged. (SiT's ``t`` is ``1 - sigma`` and its velocity ``data - noise``.)

Latent space with a VAE (decoded after dividing by ``vae.config.scaling_factor``) or pixel space without one (the
transformer's output in [-1, 1] is the image). Classifier-free guidance uses the null class ``num_classes``.

Folders load with diffusers' generic loader too: ``save_pretrained`` writes diffusers' convention for a pipeline
that lives outside diffusers, a ``pipeline.py`` beside ``model_index.json`` (whose ``_class_name`` is
``["pipeline", "NaLaDiTPipeline"]``). That file only imports this class from the installed ``nala_gen``, so
``DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`` works in a fresh process, and diffusers' own
error without it names that argument. (diffusers looks up a plain ``_class_name`` only among its own classes, so
an importable-library entry cannot name a pipeline.) ``NaLaDiTPipeline.from_pretrained`` needs no such argument:
it checks that the folder's ``pipeline.py`` is exactly the file it writes, and refuses any other code.
"""

import inspect
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.models.autoencoders import AutoencoderKL
from diffusers.pipelines.pipeline_utils import DiffusionPipeline, ImagePipelineOutput
from diffusers.schedulers import DDPMScheduler, FlowMatchEulerDiscreteScheduler, FlowMatchHeunDiscreteScheduler
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils.torch_utils import randn_tensor

from nala_gen.profiling import PeakMemory, synchronize

from .model import NaLaDiTTransformer2DModel
from .processors import block_processor

FLOW_SCHEDULERS = (FlowMatchEulerDiscreteScheduler, FlowMatchHeunDiscreteScheduler)
LOADER_FILE = "pipeline.py"  # the custom-pipeline file diffusers' generic loader imports from a folder
LOADER_CODE = (
    '"""NaLaDiT\'s pipeline for diffusers\' generic loader (written by nala_gen; the code is in the package)."""\n'
    "\n"
    "from nala_gen.diffusion.pipeline import NaLaDiTPipeline  # noqa: F401\n"
)
LEARNED_VARIANCE = ("learned", "learned_range")


class NaLaDiTPipeline(DiffusionPipeline):
    """Class-conditional image generation with a :class:`NaLaDiTTransformer2DModel`.

    Args:
        transformer: the denoiser.
        scheduler: a diffusers scheduler; FlowMatch schedulers select flow (SiT) mode, any other epsilon (DiT).
        vae: optional ``AutoencoderKL``; without one the transformer works in pixel space.
        id2label: optional ``{class id: name}`` (int or str ids, as JSON gives them back); a name may list
            synonyms separated by commas (ImageNet style). Kept in the pipeline config, so it survives
            ``save_pretrained`` / ``from_pretrained``.

    After each call ``last_readout`` holds ``latency_s``, ``peak_mem_bytes`` (above the level at the start, see
    :mod:`nala_gen.profiling`), ``tokens`` (patch tokens per image), ``steps`` and ``model_evals``.
    """

    model_cpu_offload_seq = "transformer->vae"
    _optional_components = ["vae"]
    _callback_tensor_inputs = ["latents"]

    def __init__(
        self,
        transformer: NaLaDiTTransformer2DModel,
        scheduler: SchedulerMixin,
        vae: AutoencoderKL | None = None,
        id2label: dict | None = None,
    ) -> None:
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae)
        # JSON turns int keys into strings; store them as strings so a loaded config equals the saved one.
        self.register_to_config(id2label={str(k): v for k, v in id2label.items()} if id2label else None)
        self.last_readout: dict | None = None
        self._guidance_scale, self._num_timesteps, self._interrupt = 1.0, 0, False

    # ------------------------------------------------------------------------------------------ save / load
    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """diffusers' ``save_pretrained``, plus the ``pipeline.py`` and ``_class_name`` of the generic loader."""
        super().save_pretrained(save_directory, *args, **kwargs)
        folder = Path(save_directory)
        (folder / LOADER_FILE).write_text(LOADER_CODE)
        index = folder / "model_index.json"
        config = json.loads(index.read_text())
        config["_class_name"] = [Path(LOADER_FILE).stem, type(self).__name__]
        index.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """diffusers' ``from_pretrained``; a local folder's ``pipeline.py`` is run only when it is exactly the file
        :meth:`save_pretrained` writes (then no ``trust_remote_code`` is needed); any other code is refused."""
        loader = Path(pretrained_model_name_or_path) / LOADER_FILE
        if loader.is_file() and "trust_remote_code" not in kwargs:
            if loader.read_text() != LOADER_CODE:
                raise ValueError(
                    f"{loader} is not the file nala_gen writes; read it, then pass trust_remote_code=True to run it"
                )
            kwargs["trust_remote_code"] = True
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    # ----------------------------------------------------------------------------------------------- labels
    @property
    def id2label(self) -> dict[int, str]:
        """``{class id: name}`` as given (empty without labels)."""
        return {int(k): v for k, v in (self.config.id2label or {}).items()}

    @property
    def labels(self) -> dict[str, int]:
        """``{name: class id}`` for every comma-separated synonym, lower-cased."""
        return {name.strip().lower(): i for i, names in self.id2label.items() for name in names.split(",")}

    def get_label_ids(self, class_labels: int | str | list[int | str] | torch.Tensor) -> list[int]:
        """Class ids for ints and/or names; ``num_classes`` (the null class) means unconditional.

        Raises:
            ValueError: for an id outside [0, num_classes] or an unknown name.
        """
        class_labels = _flatten(class_labels)
        num_classes = self.transformer.config.num_classes
        labels, ids = self.labels, []
        for label in class_labels:
            if isinstance(label, str):
                if label.strip().lower() not in labels:
                    known = "no id2label was given" if not labels else f"{len(labels)} names are known"
                    raise ValueError(f"unknown class name {label!r} ({known}; see pipe.labels)")
                ids.append(labels[label.strip().lower()])
            elif isinstance(label, int) and not isinstance(label, bool) and 0 <= label <= num_classes:
                ids.append(label)
            else:
                raise ValueError(
                    f"bad class id {label!r}: ids are ints in [0, {num_classes - 1}] ({num_classes} = unconditional)"
                )
        return ids

    # ------------------------------------------------------------------------------------------------ modes
    @property
    def is_flow(self) -> bool:
        """True when the scheduler is a flow-matching one (SiT mode), False for epsilon prediction (DiT mode)."""
        return isinstance(self.scheduler, FLOW_SCHEDULERS)

    @property
    def prediction_type(self) -> str:
        """What the transformer outputs: its recorded ``prediction_type``, else what the scheduler implies."""
        recorded = self.transformer.config.get("prediction_type")
        return recorded or ("flow" if self.is_flow else "epsilon")

    def check_scheduler(self) -> None:
        """Refuse, in one line naming the schedulers that fit, a scheduler of the other family than the model's
        objective (flow matching against noise prediction). Within the noise family a scheduler expecting
        another output (epsilon, v_prediction, sample) is served by converting the model's (see ``_predict``)."""
        if (self.prediction_type == "flow") == self.is_flow:
            return
        used = type(self.scheduler).__name__
        if self.prediction_type == "flow":
            fits = "FlowMatchEulerDiscreteScheduler or FlowMatchHeunDiscreteScheduler (nala-gen: euler, heun)"
            raise ValueError(f"this model was trained for flow matching (SiT); {used} does not fit it: use {fits}")
        fits = "DDPMScheduler, DDIMScheduler or DPMSolverMultistepScheduler (nala-gen: ddpm, ddim, dpm)"
        kind = self.prediction_type
        raise ValueError(f"this model was trained to predict {kind} (DiT); {used} does not fit it: use {fits}")

    def _convert(self, pred: torch.Tensor, latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The model's noise-family output as the scheduler's ``prediction_type`` expects it (x_t = a x0 + s eps)."""
        wanted = getattr(self.scheduler.config, "prediction_type", "epsilon")
        have = self.prediction_type
        if self.is_flow or wanted == have:
            return pred
        alphas = getattr(self.scheduler, "alphas_cumprod", None)
        if alphas is None:
            raise ValueError(
                f"{type(self.scheduler).__name__} expects {wanted!r}, and it has no alphas to convert {have!r}"
            )
        abar = alphas.to(latents.device, torch.float32)[int(t)]
        a, s = abar.sqrt(), (1 - abar).sqrt()
        x = latents.float()
        p = pred.float()
        eps = {"epsilon": p, "v_prediction": s * x + a * p, "sample": (x - a * p) / s}[have]
        x0 = (x - s * eps) / a
        out = {"epsilon": eps, "v_prediction": a * eps - s * x0, "sample": x0}[wanted]
        return out.to(pred.dtype)

    @property
    def vae_scale_factor(self) -> int:
        if self.vae is None:
            return 1
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def _uses_learned_variance(self) -> bool:
        # Only DDPM's step reads a learned variance; DPM-Solver's "learned" branch assumes 3 channels.
        return isinstance(self.scheduler, DDPMScheduler) and self.scheduler.config.variance_type in LEARNED_VARIANCE

    def _set_timesteps(self, num_inference_steps: int, tokens: int, device: torch.device) -> None:
        kwargs = {}
        if getattr(self.scheduler.config, "use_dynamic_shifting", False):
            # Resolution-dependent shift as in SD3/Flux: mu interpolates linearly in the token count.
            cfg = self.scheduler.config
            slope = (cfg.max_shift - cfg.base_shift) / (cfg.max_image_seq_len - cfg.base_image_seq_len)
            kwargs["mu"] = cfg.base_shift + slope * (tokens - cfg.base_image_seq_len)
        self.scheduler.set_timesteps(num_inference_steps, device=device, **kwargs)

    def _step_kwargs(self, generator: torch.Generator | list[torch.Generator] | None) -> dict:
        return {"generator": generator} if "generator" in inspect.signature(self.scheduler.step).parameters else {}

    def _predict(self, latents: torch.Tensor, t: torch.Tensor, labels: torch.Tensor):
        """One transformer evaluation -> the model output for ``scheduler.step``.

        ``latents`` (B, C, h, w), ``labels`` (B,) class ids. The guidance is the pipeline's at this step
        (``self.guidance_scale``, which a ``callback_on_step_end`` may change, as in diffusers): above 1 the null
        class runs alongside (batch 2B), else the labels alone.
        """
        channels = self.transformer.config.in_channels
        cfg = self.do_classifier_free_guidance
        model_input = torch.cat([latents, latents]) if cfg else latents
        if cfg:
            labels = torch.cat([labels, torch.full_like(labels, self.transformer.config.num_classes)])
        if hasattr(self.scheduler, "scale_model_input"):
            model_input = self.scheduler.scale_model_input(model_input, t)
        timestep = t.to(model_input.device, torch.float32).reshape(-1).expand(model_input.shape[0])
        out = self.transformer(model_input, timestep=timestep, class_labels=labels).sample
        pred, rest = out[:, :channels], out[:, channels:]
        if cfg:
            cond, uncond = pred.chunk(2)
            pred = uncond + self.guidance_scale * (cond - uncond)
            rest = rest.chunk(2)[0]
        pred = self._convert(pred, latents, t)
        if rest.shape[1] and self._uses_learned_variance():
            return torch.cat([pred, rest], dim=1)
        return pred

    def _decode(self, latents: torch.Tensor, output_type: str):
        if self.vae is not None:
            latents = latents / self.vae.config.scaling_factor
            shift = getattr(self.vae.config, "shift_factor", None)
            if shift:
                latents = latents + shift
            latents = self.vae.decode(latents.to(self.vae.dtype)).sample
        images = (latents / 2 + 0.5).clamp(0, 1)
        if output_type == "pt":
            return images
        images = images.cpu().permute(0, 2, 3, 1).float().numpy()
        return self.numpy_to_pil(images) if output_type == "pil" else images

    # ------------------------------------------------------------------------------------------------- call
    @property
    def guidance_scale(self) -> float:
        """The classifier-free guidance scale of the running call: its ``guidance_scale`` argument, until a
        ``callback_on_step_end`` sets ``pipe._guidance_scale`` (diffusers' convention); each step reads it anew."""
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        """Whether this step runs the null class alongside (``guidance_scale > 1``; at 1 guidance changes nothing)."""
        return self._guidance_scale > 1

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        """Set ``pipe._interrupt = True`` (e.g. from ``callback_on_step_end``) to skip the remaining steps."""
        return self._interrupt

    @torch.no_grad()
    def __call__(
        self,
        class_labels: int | str | list[int | str] | torch.Tensor,
        num_inference_steps: int = 50,
        guidance_scale: float = 1.0,
        num_images_per_prompt: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        height: int | None = None,
        width: int | None = None,
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> ImagePipelineOutput | tuple:
        """Generate ``num_images_per_prompt`` images per class label.

        Args:
            class_labels: class ids and/or names (looked up in ``id2label``); nested lists are flattened.
            num_inference_steps: scheduler steps.
            guidance_scale: classifier-free guidance scale; > 1 runs the null class alongside (batch doubled).
            num_images_per_prompt: images per label (a label's images are next to each other, as in diffusers).
            generator: ``torch.Generator`` (or one per image) for reproducible noise.
            latents: starting noise of shape (labels x images per label, C, h, w) instead of drawing it.
            output_type: ``"pil"`` (list of PIL images), ``"np"`` (B, H, W, C) floats in [0, 1], ``"pt"``
                (B, C, H, W) tensor in [0, 1], or ``"latent"`` (the denoised latents, not decoded).
            height, width: output size in pixels; default ``sample_size * vae_scale_factor``.
            return_dict: return an ``ImagePipelineOutput`` (else a 1-tuple).
            callback_on_step_end: called after each step as ``fn(pipe, step, timestep, callback_kwargs)``
                and returns a dict whose tensors replace the loop's (e.g. ``{"latents": ...}``). It may also set
                ``pipe._guidance_scale``, which the following steps use, as in diffusers' pipelines (e.g. 0 after
                some steps turns guidance off: the null class is no longer run).
            callback_on_step_end_tensor_inputs: which tensors the callback gets (default and allowed:
                ``["latents"]``).
        """
        if output_type not in ("pil", "np", "pt", "latent"):
            raise ValueError(f"output_type must be 'pil', 'np', 'pt' or 'latent', got {output_type!r}")
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        callback_on_step_end_tensor_inputs = callback_on_step_end_tensor_inputs or ["latents"]
        unknown = set(callback_on_step_end_tensor_inputs) - set(self._callback_tensor_inputs)
        if unknown:
            raise ValueError(f"callback_on_step_end_tensor_inputs must be among {self._callback_tensor_inputs}")
        if not isinstance(num_images_per_prompt, int) or num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt must be a positive int, got {num_images_per_prompt!r}")
        self.check_scheduler()
        self._guidance_scale = guidance_scale
        self._interrupt = False
        config = self.transformer.config
        factor = self.vae_scale_factor
        height = height or config.sample_size * factor
        width = width or config.sample_size * factor
        multiple = factor * config.patch_size
        if height % multiple or width % multiple:
            raise ValueError(f"height and width must be multiples of {multiple}, got {height}x{width}")
        latent_h, latent_w = height // factor, width // factor
        tokens = (latent_h // config.patch_size) * (latent_w // config.patch_size)

        ids = [i for i in self.get_label_ids(class_labels) for _ in range(num_images_per_prompt)]
        device = self._execution_device
        labels = torch.tensor(ids, device=device)  # the null class is added per step, while guidance is on

        synchronize(device)
        start = time.perf_counter()
        with PeakMemory(device) as peak:
            shape = (len(ids), config.in_channels, latent_h, latent_w)
            if latents is None:
                latents = randn_tensor(shape, generator=generator, device=device, dtype=self.transformer.dtype)
            elif tuple(latents.shape) != shape:
                raise ValueError(f"latents must have shape {shape}, got {tuple(latents.shape)}")
            else:
                latents = latents.to(device=device, dtype=self.transformer.dtype)
            self._set_timesteps(num_inference_steps, tokens, device)
            latents = latents * getattr(self.scheduler, "init_noise_sigma", 1.0)
            step_kwargs = self._step_kwargs(generator)
            timesteps = self.scheduler.timesteps
            self._num_timesteps = len(timesteps)
            evals = batch = 0
            for i, t in enumerate(self.progress_bar(timesteps)):
                if self.interrupt:
                    continue
                batch = max(batch, len(ids) * (2 if self.do_classifier_free_guidance else 1))
                model_output = self._predict(latents, t, labels)
                evals += 1
                latents = self.scheduler.step(model_output, t, latents, **step_kwargs).prev_sample
                if callback_on_step_end is not None:
                    tensors = {"latents": latents}
                    callback_kwargs = {name: tensors[name] for name in callback_on_step_end_tensor_inputs}
                    outputs = callback_on_step_end(self, i, t, callback_kwargs)
                    latents = outputs.pop("latents", latents)
            images = latents if output_type == "latent" else self._decode(latents, output_type)
            synchronize(device)
        self.last_readout = {
            "latency_s": time.perf_counter() - start,
            "peak_mem_bytes": peak.peak_bytes,
            "tokens": tokens,
            "steps": num_inference_steps,
            "model_evals": evals,
            "batch": batch,  # the largest the transformer ran (doubled while guidance was on)
            "mode": "flow" if self.is_flow else "epsilon",
            "prediction_type": self.prediction_type,
            # the kernels the processors ran (set_attn_processor may have swapped the config's)
            "kernel": "+".join(sorted({block_processor(p).kernel for p in self.transformer.attn_processors.values()})),
            "device": str(device),
        }
        self.maybe_free_model_hooks()
        if not return_dict:
            return (images,)
        return ImagePipelineOutput(images=images)


def _flatten(labels) -> list:
    """Class labels as one flat list: a tensor, one label, or (nested) lists and tuples of them."""
    if isinstance(labels, torch.Tensor):
        return labels.reshape(-1).tolist()
    if isinstance(labels, (list, tuple)):
        return [x for item in labels for x in _flatten(item)]
    return [labels]
