"""``nala-gen train``: train a NaLaDiT (``objective: dit``) or NaLaSiT (``objective: sit``) with accelerate.

    nala-gen train --config options/diffusion/naladit_digits.yml [--override lr=3e-4 ...] [--resume latest|PATH]
    python -m nala_gen.diffusion.train --config ...                        # the same, one process
    accelerate launch -m nala_gen.diffusion.train --config ...             # GPUs, as accelerate is configured
    torchrun --nproc_per_node 2 -m nala_gen.diffusion.train --config ...   # several processes (CPU: gloo)

What a run writes under ``output_dir`` (a fresh run refuses a folder that already holds checkpoints):
``config.yml``; ``log.jsonl`` (step, loss, lr, grad norm every ``log_every`` steps; a resumed run drops the lines
after its checkpoint); ``checkpoints/step_N`` (accelerate's state: weights, optimizer, RNG; plus ``ema.safetensors``
and ``train_state.json``; the last ``keep_checkpoints`` are kept, each written to a temporary folder first);
at the end ``pipeline/`` (a :class:`NaLaDiTPipeline` with the EMA weights, the objective's scheduler and the class
names) and ``training_info.json``.

Resuming is exact: batches and noise come from generators seeded by ``(seed, step, micro-batch, rank)``, not from
a data loader's state, so a resumed run computes the same losses as one that never stopped. A non-finite loss (or,
outside fp16, gradient norm) stops every process at once with a one-line error and exit status 1, before anything
of that step is applied or saved; the last good checkpoint stays.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from .train_config import TrainConfig, load_config

PROG = "nala-gen train"


class TrainingError(RuntimeError):
    """A training that cannot go on (reported as one line, exit status 1)."""


class NonFiniteError(TrainingError):
    """The loss or the gradient norm is NaN or infinite."""


# --------------------------------------------------------------------------------------------------- helpers
def _has_accelerator() -> bool:
    xpu = getattr(torch, "xpu", None)
    return torch.cuda.is_available() or torch.backends.mps.is_available() or bool(xpu and xpu.is_available())


def state_sha256(module: torch.nn.Module) -> str:
    """sha256 of a state dict (names, dtypes, shapes and bytes), to check that processes hold the same weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    """``output_dir/checkpoints/step_N`` folders, oldest first."""
    root = output_dir / "checkpoints"
    found = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[5:]))


def remove_stale_temporaries(output_dir: Path) -> list[Path]:
    """Delete the ``.step_N.tmp`` / ``.pipeline.tmp`` folders a killed run left behind (never read); returns them."""
    stale = [*(output_dir / "checkpoints").glob(".step_*.tmp"), *output_dir.glob(".pipeline.tmp")]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def find_resume(output_dir: Path, resume: str | None) -> Path | None:
    """``latest`` -> the newest checkpoint (None if there is none yet); a path -> that checkpoint folder."""
    if not resume:
        return None
    if resume == "latest":
        found = checkpoint_dirs(output_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / "train_state.json").is_file():
        raise FileNotFoundError(f"--resume {resume}: not a checkpoint folder (no train_state.json)")
    return path


def trim_log(log_path: Path, step: int) -> None:
    """Keep the log lines of steps up to ``step`` (the resumed one; 0 for a fresh run): they are redone after it."""
    if log_path.is_file():
        kept = [line for line in log_path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        log_path.write_text("".join(f"{line}\n" for line in kept))


def load_vae(path: str, device: torch.device):
    from diffusers.models.autoencoders import AutoencoderKL

    if not Path(path).is_dir():
        raise FileNotFoundError(f"vae {path!r} is not a local diffusers AutoencoderKL folder")
    vae = AutoencoderKL.from_pretrained(path, local_files_only=True).to(device).eval()
    vae.requires_grad_(False)
    return vae


def build_model(config: TrainConfig, num_classes: int, vae=None):
    """The transformer of ``config.model``, its sample size, channels and classes fitted to the data (and VAE)."""
    from .model import NaLaDiTTransformer2DModel

    overrides = dict(config.model)
    size = overrides.pop("size", "tiny")
    factor = 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1
    if config.data.image_size % factor:
        raise ValueError(f"data.image_size {config.data.image_size} is not a multiple of the VAE factor {factor}")
    derived = {
        "sample_size": config.data.image_size // factor,
        "in_channels": vae.config.latent_channels if vae is not None else config.data.channels,
        "num_classes": num_classes,
        "learn_sigma": False,
    }
    for key, value in derived.items():
        if key in overrides and overrides[key] != value:
            raise ValueError(f"model.{key}={overrides[key]} does not fit the data (it must be {value}); drop it")
    overrides.update(derived)
    torch.manual_seed(config.seed)  # the same initial weights on every process and every run
    model = NaLaDiTTransformer2DModel.from_size(size, **overrides)
    if derived["sample_size"] % model.config.patch_size:
        raise ValueError(f"sample size {derived['sample_size']} is not a multiple of patch_size")
    return model


def make_batch(dataset, indices: torch.Tensor, gen: torch.Generator, config: TrainConfig, vae, device):
    """Clean training inputs (B, C, H, W) (pixels in [-1, 1] or scaled latents) and labels (B,) on ``device``."""
    images, labels = dataset.batch(indices)
    if config.data.hflip:
        flip = torch.rand(len(indices), generator=gen) < 0.5
        images = torch.where(flip[:, None, None, None], images.flip(-1), images)
    images = images.to(device)
    if vae is not None:
        with torch.no_grad():
            latents = vae.encode(images.to(vae.dtype)).latent_dist.sample(generator=gen)
        # The inverse of the pipeline's decode: latents / scaling_factor + shift_factor.
        shift = getattr(vae.config, "shift_factor", None) or 0.0
        images = (latents.float() - shift) * vae.config.scaling_factor
    return images, labels.to(device)


# ------------------------------------------------------------------------------------------------ checkpoints
def save_checkpoint(accelerator, output_dir: Path, step: int, model, ema, config: TrainConfig) -> Path:
    """accelerate's state plus EMA and step, into a temporary folder renamed to ``checkpoints/step_N``."""
    from safetensors.torch import save_file

    root = output_dir / "checkpoints"
    final, tmp = root / f"step_{step}", root / f".step_{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()  # every process writes its own RNG state into tmp before it is renamed
    if accelerator.is_main_process:
        if ema is not None:
            names = [name for name, _ in accelerator.unwrap_model(model).named_parameters()]
            shadow = {n: p.detach().cpu().contiguous() for n, p in zip(names, ema.shadow_params, strict=True)}
            save_file(shadow, str(tmp / "ema.safetensors"))
        state = {
            "step": step,
            "ema_optimization_step": ema.optimization_step if ema is not None else None,
            "objective": config.objective,
            "seed": config.seed,
        }
        (tmp / "train_state.json").write_text(json.dumps(state, indent=2) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in checkpoint_dirs(output_dir)[: -config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: Path, model, ema, config: TrainConfig) -> int:
    """Restore accelerate's state and the EMA from ``path``; returns the step it was saved at."""
    from safetensors.torch import load_file

    state = json.loads((path / "train_state.json").read_text())
    if state.get("objective") != config.objective:
        raise ValueError(f"checkpoint {path} was trained with objective {state.get('objective')!r}, not this one")
    accelerator.load_state(str(path))
    if ema is not None:
        if not (path / "ema.safetensors").is_file():
            raise ValueError(f"checkpoint {path} has no EMA weights but ema_decay is set")
        shadow = load_file(str(path / "ema.safetensors"))
        names = [name for name, _ in accelerator.unwrap_model(model).named_parameters()]
        with torch.no_grad():
            for name, param in zip(names, ema.shadow_params, strict=True):
                param.copy_(shadow[name])
        ema.optimization_step = int(state["ema_optimization_step"])
    return int(state["step"])


def save_pipeline(output_dir: Path, model, ema, objective, vae, id2label: dict) -> Path:
    """``output_dir/pipeline``: the EMA (else raw) weights in float32 with the sampling scheduler and class names."""
    from .model import NaLaDiTTransformer2DModel
    from .pipeline import NaLaDiTPipeline

    # The folder records what the model outputs, so a swapped scheduler is checked against it.
    final = NaLaDiTTransformer2DModel.from_config(model.config, prediction_type=objective.prediction_type)
    final.load_state_dict({k: v.detach().float().cpu() for k, v in model.state_dict().items()})
    if ema is not None:
        ema.copy_to(final.parameters())
    pipe = NaLaDiTPipeline(
        transformer=final.float().cpu().eval(),
        scheduler=objective.scheduler(),
        vae=vae.float().cpu() if vae is not None else None,
        id2label=id2label,
    )
    target, tmp = output_dir / "pipeline", output_dir / ".pipeline.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


# ------------------------------------------------------------------------------------------------------ train
def train(config: TrainConfig, resume: str | None = None, progress: bool = True) -> dict:
    """Run (or continue) one training; returns what ``training_info.json`` holds.

    Raises:
        NonFiniteError: the loss or gradient norm became NaN/inf (nothing of that step is applied or saved).
        ValueError, FileNotFoundError: a config that does not fit the data, VAE or checkpoint.
    """
    import accelerate
    import diffusers
    import yaml
    from accelerate import Accelerator
    from diffusers.training_utils import EMAModel
    from tqdm.auto import tqdm

    from .data import EpochSampler, build_dataset, generator
    from .objectives import build_objective, drop_labels

    on_cpu = config.cpu or not _has_accelerator()
    mixed = config.mixed_precision
    accelerator = Accelerator(
        mixed_precision="no" if on_cpu else mixed,
        gradient_accumulation_steps=config.grad_accum,
        log_with=None,
        cpu=on_cpu,
    )
    if on_cpu and mixed != "no":
        accelerator.print(f"{PROG}: mixed_precision={mixed} is ignored on the CPU; training in float32")
        mixed = "no"
    device, world, rank = accelerator.device, accelerator.num_processes, accelerator.process_index
    output_dir = Path(config.output_dir)
    resume_dir = find_resume(output_dir, resume)
    if resume == "latest" and resume_dir is None:
        accelerator.print(f"{PROG}: no checkpoint in {output_dir / 'checkpoints'} yet; starting from scratch")
    if not resume and checkpoint_dirs(output_dir):
        raise ValueError(f"{output_dir} already holds checkpoints: pass --resume latest, or choose another output_dir")

    dataset = build_dataset(config.data)
    vae = load_vae(config.vae, device) if config.vae else None
    if vae is not None and vae.config.in_channels != config.data.channels:
        raise ValueError(
            f"the VAE takes {vae.config.in_channels}-channel images but data.channels is {config.data.channels}"
        )
    model = build_model(config, len(dataset.id2label), vae)
    objective = build_objective(config.objective, config.sigma_sampling, pixel_space=vae is None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    ema = EMAModel(model.parameters(), decay=config.ema_decay, foreach=True) if config.ema_decay else None
    model, optimizer = accelerator.prepare(model, optimizer)
    if ema is not None:
        ema.to(device)

    step = load_checkpoint(accelerator, resume_dir, model, ema, config) if resume_dir else 0
    first_step = step
    unwrapped = accelerator.unwrap_model(model)
    params = sum(p.numel() for p in unwrapped.parameters())
    log_path = output_dir / "log.jsonl"
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(output_dir)
        (output_dir / "config.yml").write_text(yaml.safe_dump(config.as_dict(), sort_keys=False))
        trim_log(log_path, step)
    accelerator.print(
        f"{PROG}: {config.objective} {config.model.get('size', 'tiny')} ({params / 1e6:.2f}M params, "
        f"{unwrapped.config.kernel}) on {dataset.description}; {world} process(es) on {device}, "
        f"batch {config.batch_size} x {config.grad_accum} x {world}"
        + (f"; resumed from {resume_dir} (step {step})" if resume_dir else "")
    )

    sampler = EpochSampler(len(dataset), config.seed)
    null_class = unwrapped.config.num_classes
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    bar = tqdm(
        total=config.max_steps, initial=step, desc="train", disable=not (progress and accelerator.is_main_process)
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    smoothed, last_loss, last_saved = None, None, resume_dir
    model.train()
    while step < config.max_steps:
        lr = config.lr * min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps else config.lr
        for group in optimizer.param_groups:  # set every step, so a resumed run follows the config's lr
            group["lr"] = lr
        losses, grad_norm = [], float("nan")
        for micro in range(config.grad_accum):
            # This process's slice of global batch (step, micro); its augmentation and noise stream.
            position = ((step * config.grad_accum + micro) * world + rank) * config.batch_size
            indices = sampler.indices(position, config.batch_size)
            gen = generator(config.seed, 1, step, micro, rank)
            with accelerator.accumulate(model):
                x0, labels = make_batch(dataset, indices, gen, config, vae, device)
                labels = drop_labels(labels, config.class_dropout_prob, null_class, gen)
                loss = objective.loss(model, x0, labels, gen)
                gathered = accelerator.gather(loss.detach().float().reshape(1))
                if not torch.isfinite(gathered).all():
                    kept = f"last good checkpoint: {last_saved}" if last_saved else "no checkpoint was saved"
                    raise NonFiniteError(
                        f"loss is {gathered.sum().item()} at step {step + 1}; stopped without saving ({kept})"
                    )
                losses.append(gathered.mean().item())
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), max_norm))
                    # fp16's loss scaler skips overflowing steps by itself; elsewhere inf/NaN gradients are fatal.
                    if not math.isfinite(grad_norm) and mixed != "fp16":
                        kept = f"last good checkpoint: {last_saved}" if last_saved else "no checkpoint was saved"
                        raise NonFiniteError(
                            f"gradient norm is {grad_norm} at step {step + 1}; stopped without saving ({kept})"
                        )
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        step += 1
        if ema is not None:
            ema.step(unwrapped.parameters())
        last_loss = sum(losses) / len(losses)
        smoothed = last_loss if smoothed is None else 0.9 * smoothed + 0.1 * last_loss
        bar.update(1)
        bar.set_postfix(loss=f"{smoothed:.4f}", lr=f"{lr:.2e}")
        if accelerator.is_main_process and (step % config.log_every == 0 or step == config.max_steps):
            record = {"step": step, "loss": last_loss, "lr": lr, "grad_norm": grad_norm}
            record["elapsed_s"] = round(time.perf_counter() - start, 3)
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if step % config.checkpoint_every == 0 or step == config.max_steps:
            last_saved = save_checkpoint(accelerator, output_dir, step, model, ema, config)
    bar.close()
    elapsed, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start

    hashes = accelerate.utils.gather_object([state_sha256(unwrapped)])
    if len(set(hashes)) != 1:  # every process sees the same list, so all of them stop here together
        raise TrainingError(f"the processes ended with different weights: {hashes}")
    info = {
        "steps": step,
        "steps_this_run": step - first_step,
        "resumed_from": str(resume_dir) if resume_dir else None,
        "wall_time_s": round(elapsed, 3),
        "s_per_step": round(elapsed / max(1, step - first_step), 4),
        # CPU seconds of this process (all threads): a load-independent cost where the machine is shared.
        "cpu_s_per_step": round(cpu_time / max(1, step - first_step), 4),
        "final_loss": last_loss,
        "objective": config.objective,
        "data": {
            "source": config.data.source,
            "description": dataset.description,
            "images": len(dataset),
            "image_size": config.data.image_size,
            "channels": config.data.channels,
            "classes": len(dataset.id2label),
        },
        "params": params,
        "model_config": {k: v for k, v in unwrapped.config.items() if not k.startswith("_")},
        "num_processes": world,
        "effective_batch": config.batch_size * config.grad_accum * world,
        "device": str(device),
        "mixed_precision": mixed,
        "ema": ema is not None,
        "weights_sha256_per_rank": hashes,
        "versions": {
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "accelerate": accelerate.__version__,
        },
        "config": config.as_dict(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    if accelerator.is_main_process:
        info["pipeline"] = str(save_pipeline(output_dir, unwrapped, ema, objective, vae, dataset.id2label))
        (output_dir / "training_info.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
        accelerator.print(f"{PROG}: {step} steps, final loss {last_loss}; wrote {info['pipeline']}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return info


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Train a NaLaDiT / NaLaSiT class-conditional model.")
    parser.add_argument("--config", required=True, help="YAML config (see options/diffusion/)")
    parser.add_argument(
        "--override", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help="e.g. model.depth=4 lr=3e-4"
    )
    parser.add_argument("--resume", help="'latest' (newest checkpoint of output_dir, if any) or a checkpoint folder")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    try:
        train(load_config(args.config, args.override), args.resume, progress=not args.quiet)
    except (TrainingError, ValueError, FileNotFoundError) as err:
        if main_rank:
            print(f"{PROG}: error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
