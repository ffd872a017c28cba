"""``nala-app``: the NaLa web app (Gradio): upscale images, generate class-conditional samples, see attention scale.

    nala-app [--host 127.0.0.1] [--port 7860] [--max-pixels 4000000] [--max-file-size 20mb] [--pipeline DIR ...]
    python -m nala_gen.app.ui ...      (or apps/app.py in the repository)

Tabs:

* Upscale: NaLaSR / ESRT named weights through the same engine as ``nala-sr upscale`` (tiles auto/off/size,
  device, precision), a before/after slider, the PNG, and the readout (latency, peak memory, tokens, tiles).
* Generate: a NaLaDiT / NaLaSiT pipeline (named weights of task ``diffusion`` or ``--pipeline`` folders) with class,
  steps, guidance, scheduler, seed and number of images; a PNG grid and the readout.
* Scaling: latency and peak memory against token count for NaLa, fused softmax, ESRT's split softmax and explicit
  softmax: the committed benchmark, and live measurements (memory that cannot fit is computed, not run).

Production manners: one job at a time across all tabs (queue, shared concurrency slot), upload size and pixel
limits, one-line error messages in the page (tracebacks only in the server log), no request to any other host
(system fonts, no analytics), PNG outputs, named API endpoints ``/upscale`` and ``/generate``.
"""

from __future__ import annotations

import argparse
import html
import logging
import os
import sys
from pathlib import Path

# Before gradio is imported: no analytics or version check, no Hub look-ups from diffusers.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402
from PIL import Image  # noqa: E402

from nala_gen.app import scaling  # noqa: E402
from nala_gen.app.engine import SAMPLE, AppConfig, Engine, UserError, devices, one_line, precisions  # noqa: E402

log = logging.getLogger("nala_app")
CONCURRENCY_ID = "compute"  # every heavy event shares one slot: two users never double the memory
# Progress trackers as gradio expects them (a default argument); track_tqdm follows the denoising / tile bars.
TRACKED, PROGRESS = gr.Progress(track_tqdm=True), gr.Progress()
THEME = gr.themes.Default(font=[gr.themes.Font("system-ui"), "sans-serif"], font_mono=["monospace"])
CSS = """
#upscale-readout table, #generate-readout table { width: 100%; }
#generate-output img { image-rendering: pixelated; }
"""
NO_SR = (
    "**No super-resolution weights are installed.** Run `make weights-sr` (trains and ships `nalasr-light-x4`, "
    "`nalasr-light-x2`, `esrt-x4`), or point `NALA_GEN_WEIGHTS` at a folder of named weights."
)
NO_DIFFUSION = (
    "**No diffusion pipeline is installed.** Train and export one (`nala-gen train`, `nala-gen export`), or start "
    "the app with `--pipeline PATH/TO/pipeline`."
)


def _guard(what: str, fn, *args, **kwargs):
    """Run a job; user mistakes become their one-line message, anything else a short error (trace in the log)."""
    try:
        return fn(*args, **kwargs)
    except UserError as err:
        raise gr.Error(html.escape(str(err), quote=False), print_exception=False) from None
    except gr.Error:
        raise
    except Exception as err:
        log.exception("%s failed", what)
        message = f"{what} failed: {one_line(err)} (details in the server log)"
        raise gr.Error(html.escape(message, quote=False), print_exception=False) from None


# ------------------------------------------------------------------------------------------------------- upscale
def friendly_uploads(component: gr.Image) -> gr.Image:
    """Make an unreadable upload a one-line message in the page instead of gradio's processing error.

    (Wraps this instance's ``preprocess``; a ``gr.Image`` subclass would make gradio write a ``.pyi`` stub beside
    this file.)
    """
    preprocess = component.preprocess

    def checked(payload):
        try:
            return preprocess(payload)
        except gr.Error:
            raise
        except Exception as err:  # PIL's UnidentifiedImageError and friends, before our code sees the file
            name = html.escape(getattr(payload, "orig_name", None) or "file", quote=False)
            if isinstance(err, Image.DecompressionBombError):
                raise gr.Error(
                    f"the upload ({name}) has too many pixels to open safely", print_exception=False
                ) from None
            raise gr.Error(f"the upload ({name}) is not an image file", print_exception=False) from None

    component.preprocess = checked
    return component


def _scale_choices(models: list[tuple[str, int, str]]) -> list[str]:
    """The shipped scales, whether installed or not, as the strings the API schema lists."""
    return [str(s) for s in sorted({2, 4} | {s for _, s, _ in models})]


def _preferred_model(choices: list[tuple[str, str]], scale: int | None) -> str | None:
    """The scale's default model (NaLaSR, as ``nala-sr upscale``) when installed, else the first one."""
    from nala_gen.sr.loading import DEFAULT_MODELS

    names = [name for _, name in choices]
    default = DEFAULT_MODELS.get(scale)
    return default if default in names else (names[0] if names else None)


def _model_choices(models: list[tuple[str, int, str]], scale: int | None) -> list[tuple[str, str]]:
    return [(label, name) for name, s, label in models if scale is None or s == scale]


def build_upscale_tab(engine: Engine) -> dict:
    models = engine.sr_models()
    scales = _scale_choices(models)
    scale0 = 4 if any(s == 4 for _, s, _ in models) else (models[0][1] if models else 4)
    choices0 = _model_choices(models, scale0)
    scale0 = str(scale0)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            image = gr.Image(
                type="filepath",
                image_mode=None,  # hand the upload over untouched: 16-bit, alpha and EXIF are read by the engine
                sources=["upload", "clipboard"],
                label="Low-resolution input",
                elem_id="upscale-input",
                height=260,
            )
            friendly_uploads(image)
            if SAMPLE.is_file():
                gr.Examples([[str(SAMPLE)]], inputs=[image], label="Example: x4 bicubic LR of scikit-image's 'chelsea'")
            notice = gr.Markdown(NO_SR, visible=not models, elem_id="upscale-notice")
            with gr.Row():
                scale = gr.Radio(scales, value=scale0, label="Scale", elem_id="upscale-scale", min_width=150, scale=0)
                model = gr.Dropdown(
                    choices0,
                    value=_preferred_model(choices0, int(scale0)),
                    label="Model",
                    allow_custom_value=True,  # checked by the engine against the weights installed now
                    elem_id="upscale-model",
                    min_width=200,
                    scale=1,
                )
            with gr.Row():
                tile_mode = gr.Radio(
                    ["auto", "off", "size"],
                    value="auto",
                    label="Tiles",
                    info="auto: from free memory; off: whole image in one pass",
                    elem_id="upscale-tile-mode",
                )
                tile_size = gr.Number(256, label="Tile size (px)", precision=0, minimum=32, visible=False)
            with gr.Row():
                device = gr.Dropdown(devices(), value="auto", label="Device", elem_id="upscale-device")
                precision = gr.Dropdown(precisions(), value="auto", label="Precision", elem_id="upscale-precision")
            with gr.Accordion("More options", open=False):
                outscale = gr.Number(0, label="Final scale (0 = the model's; other values resample with Lanczos)")
                alpha = gr.Radio(["model", "bicubic"], value="model", label="Alpha channel upscaled by")
            button = gr.Button("Upscale", variant="primary", elem_id="upscale-button")
            gr.Markdown(
                f"Limits: {engine.config.max_pixels:,} input pixels, {engine.config.max_file_size} per upload. "
                "One job runs at a time; others wait in the queue.",
                elem_id="upscale-limits",
            )
        with gr.Column(scale=3, min_width=360):
            slider = gr.ImageSlider(
                label="Before (nearest) | after", format="png", elem_id="upscale-slider", max_height=560
            )
            result_file = gr.File(label="Result (PNG, full depth)", elem_id="upscale-file", height=90)
            readout = gr.Markdown(elem_id="upscale-readout")
            with gr.Accordion("Readout (JSON)", open=False):
                readout_json = gr.JSON(elem_id="upscale-json")
            board = scaling.peer_board(engine.config.results_dir)
            if board:
                with gr.Accordion("This model among its peers", open=True, elem_id="upscale-peers"):
                    pareto = gr.Plot(
                        scaling.pareto_for(board, engine.sr_arch(_preferred_model(choices0, int(scale0)))),
                        elem_id="upscale-pareto",
                    )
                    gr.Markdown(
                        "The committed `nala-bench peers` board: x4 networks at 1 MP out on the CPU named in the "
                        "README, PSNR-Y of equal-budget trainings (1,000 iterations on the embedded set, mean ± sd "
                        "over seeds). The chosen model is marked by its architecture (an x2 model at its x4 point).",
                        elem_id="upscale-peers-note",
                    )
    with gr.Accordion(
        f"Video: a short clip (up to {engine.config.max_video_seconds:g} s, frames up to "
        f"{engine.config.max_video_pixels:,} pixels), every frame through the model above, audio kept",
        open=False,
        elem_id="upscale-video",
    ):
        with gr.Row(equal_height=False):
            video_in = gr.Video(label="Input video", sources=["upload"], elem_id="upscale-video-input", height=240)
            video_out = gr.Video(label="Upscaled (H.264, CRF 18)", elem_id="upscale-video-output", height=240)
        video_button = gr.Button("Upscale video", elem_id="upscale-video-button")
        video_readout = gr.Markdown(elem_id="upscale-video-readout")

    def upscale(image, scale, model, tile_mode, tile_size, device, precision, outscale, alpha, progress=TRACKED):
        """Upscale an image with a named super-resolution model; returns (before/after, PNG, readout, JSON)."""
        import cv2

        from nala_gen.app.engine import to_display

        progress(0, desc="upscaling")
        lr, sr, record, path = _guard(
            "upscaling",
            engine.upscale,
            image,
            model,
            tile_mode=tile_mode,
            tile_size=int(tile_size or 0),
            device=device or "auto",
            precision=precision or "auto",
            outscale=float(outscale) if outscale else None,
            alpha=alpha or "model",
            scale=int(scale) if scale else None,
            tqdm_progress=True,
        )
        sr = to_display(sr)
        before = cv2.resize(to_display(lr), (sr.shape[1], sr.shape[0]), interpolation=cv2.INTER_NEAREST)
        return (before, sr), str(path), Engine.upscale_markdown(record), record

    button.click(
        upscale,
        inputs=[image, scale, model, tile_mode, tile_size, device, precision, outscale, alpha],
        outputs=[slider, result_file, readout, readout_json],
        api_name="upscale",
        concurrency_limit=1,
        concurrency_id=CONCURRENCY_ID,
    )
    tile_mode.change(
        lambda mode: gr.update(visible=mode == "size"), tile_mode, tile_size, api_visibility="private", queue=False
    )

    def upscale_video(video, model, device, progress=TRACKED):
        """Upscale a short video with a named super-resolution model; returns (MP4, readout, JSON)."""
        progress(0, desc="upscaling frames")
        record, path = _guard("upscaling the video", engine.upscale_video, video, model, device or "auto", True)
        return str(path), Engine.video_markdown(record), record

    video_button.click(
        upscale_video,
        inputs=[video_in, model, device],
        outputs=[video_out, video_readout, readout_json],
        api_name="upscale_video",
        concurrency_limit=1,
        concurrency_id=CONCURRENCY_ID,
    )

    def on_scale(scale):
        s = int(scale) if scale else None
        choices = _model_choices(engine.sr_models(), s)
        return gr.update(choices=choices, value=_preferred_model(choices, s))

    scale.input(on_scale, scale, model, api_visibility="private", queue=False)
    if board:
        model.change(
            lambda name: scaling.pareto_for(board, engine.sr_arch(name)),
            model,
            pareto,
            api_visibility="private",
            queue=False,
        )

    def refresh(current_scale, current_model):
        models = engine.sr_models()
        scales = _scale_choices(models)
        installed = {s for _, s, _ in models}
        current = int(current_scale) if current_scale else None
        s = current if current in installed or not installed else (4 if 4 in installed else min(installed))
        choices = _model_choices(models, s)
        names = [v for _, v in choices]
        value = current_model if current_model in names else _preferred_model(choices, s)
        return (
            gr.update(choices=scales, value=str(s) if s else None),
            gr.update(choices=choices, value=value),
            gr.update(visible=not models),
        )

    return {"refresh": (refresh, [scale, model], [scale, model, notice])}


# ------------------------------------------------------------------------------------------------------ generate
def _mode_text(options: dict) -> str:
    return f"Mode: {options['mode']}, {options['sample_size']} px samples"


def build_generate_tab(engine: Engine) -> dict:
    specs = engine.diffusion_models()
    first = specs[0][0] if specs else None
    options = None
    if first is not None:
        try:
            options = engine.pipeline_options(first)
        except UserError as err:
            log.warning("diffusion model %s: %s", first, err)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            notice = gr.Markdown(NO_DIFFUSION, visible=not specs, elem_id="generate-notice")
            model = gr.Dropdown(
                [(label, spec) for spec, label in specs],
                value=first,
                label="Model",
                allow_custom_value=True,
                elem_id="generate-model",
            )
            mode = gr.Markdown(_mode_text(options) if options else "", elem_id="generate-mode")
            class_id = gr.Dropdown(
                options["classes"] if options else [],
                value=options["classes"][0][1] if options else None,
                label="Class",
                allow_custom_value=True,
                elem_id="generate-class",
            )
            with gr.Row():
                steps = gr.Slider(1, 250, value=25, step=1, label="Steps", elem_id="generate-steps")
                guidance = gr.Slider(0, 10, value=1.0, step=0.25, label="Guidance (1 = off)", elem_id="generate-cfg")
            with gr.Row():
                scheduler = gr.Dropdown(
                    options["schedulers"] if options else [],
                    value=options["scheduler"] if options else None,
                    label="Scheduler",
                    allow_custom_value=True,
                    elem_id="generate-scheduler",
                )
                seed = gr.Number(0, label="Seed", precision=0, elem_id="generate-seed")
            with gr.Row():
                num_images = gr.Slider(1, 16, value=4, step=1, label="Images", elem_id="generate-num")
                device = gr.Dropdown(devices(), value="auto", label="Device", elem_id="generate-device")
            button = gr.Button("Generate", variant="primary", elem_id="generate-button")
        with gr.Column(scale=3, min_width=360):
            output = gr.Image(
                label="Samples (enlarged, nearest)", format="png", type="pil", elem_id="generate-output", height=420
            )
            result_file = gr.File(label="Grid (PNG, native size)", elem_id="generate-file", height=90)
            readout = gr.Markdown(elem_id="generate-readout")
            with gr.Accordion("Readout (JSON)", open=False):
                readout_json = gr.JSON(elem_id="generate-json")

    def generate(model, class_id, steps, guidance, scheduler, seed, num_images, device, progress=TRACKED):
        """Sample class-conditional images; returns (grid PNG, grid file, readout, JSON)."""
        progress(0, desc="loading the model")
        image, record, path = _guard(
            "generation",
            engine.generate,
            model,
            class_id,
            steps=steps,
            guidance=guidance,
            scheduler=scheduler,
            seed=seed,
            num_images=num_images,
            device=device or "auto",
        )
        return image, str(path), Engine.generate_markdown(record), record

    button.click(
        generate,
        inputs=[model, class_id, steps, guidance, scheduler, seed, num_images, device],
        outputs=[output, result_file, readout, readout_json],
        api_name="generate",
        concurrency_limit=1,
        concurrency_id=CONCURRENCY_ID,
    )

    def on_model(spec):
        opts = _guard("loading the model", engine.pipeline_options, spec)
        return (
            gr.update(choices=opts["classes"], value=opts["classes"][0][1]),
            gr.update(choices=opts["schedulers"], value=opts["scheduler"]),
            _mode_text(opts),
        )

    model.input(on_model, model, [class_id, scheduler, mode], api_visibility="private")

    def refresh(current):
        specs = engine.diffusion_models()
        names = [s for s, _ in specs]
        value = current if current in names else (names[0] if names else None)
        updates = [gr.update(choices=[(label, s) for s, label in specs], value=value), gr.update(visible=not specs)]
        if value is None or value == current:
            return (*updates, gr.update(), gr.update(), gr.update())
        return (*updates, *on_model(value))

    return {"refresh": (refresh, [model], [model, notice, class_id, scheduler, mode])}


# ------------------------------------------------------------------------------------------------------- scaling
def build_scaling_tab(engine: Engine) -> None:
    committed = scaling.committed_attention(engine.config.results_dir)
    sr_rows = scaling.committed_sr(engine.config.results_dir)
    gr.Markdown(
        "Attention alone, as `nala-bench attention` measures it: q, k, v of shape (1, 4 heads, N, 32), fp32, CPU; "
        "peak memory is what the op adds above its inputs. 71,680 tokens is a 256×280 LR image in NaLaSR. "
        "Explicit softmax needs two N×N matrices per head (≈164 GB at 71,680 tokens) and ESRT's split attention two "
        "(N/4)×(N/4) ones: where they cannot fit, their memory is **computed, not measured**. "
        + ("" if committed else "No committed results found (run `make bench`).")
    )
    plot = gr.Plot(scaling.plot(committed, "Committed benchmark (fresh process per point)"), elem_id="scaling-plot")
    with gr.Row():
        tokens = gr.Dropdown(
            [(f"{n:,}", n) for n in scaling.TOKEN_CHOICES],
            value=4096,
            label="Tokens N",
            allow_custom_value=True,
            elem_id="scaling-tokens",
        )
        methods = gr.CheckboxGroup(
            [(scaling.METHODS[m], m) for m in scaling.LIVE_METHODS],
            value=["nala", "softmax_sdpa", "esrt_split"],
            label="Methods",
            elem_id="scaling-methods",
        )
        button = gr.Button("Measure now", variant="primary", elem_id="scaling-button", scale=0, min_width=140)
    table = gr.Dataframe(
        scaling.to_frame(committed), label="Attention scaling", elem_id="scaling-table", interactive=False
    )
    if sr_rows:
        gr.Plot(scaling.plot(sr_rows, "Whole x4 networks against LR tokens (committed)"))
        gr.Dataframe(scaling.to_frame(sr_rows), label="Super-resolution networks", interactive=False)
    live = gr.State([])

    def measure_now(tokens, methods, rows, progress=PROGRESS):
        """Measure the chosen methods at N tokens in this process (computed memory where a run cannot fit)."""
        try:
            n = int(str(tokens).replace(",", ""))
        except ValueError:
            raise gr.Error(f"tokens must be a whole number, got {html.escape(str(tokens), quote=False)}") from None
        if not 16 <= n <= 1_000_000:
            raise gr.Error(f"tokens must be between 16 and 1,000,000, got {n:,}")
        new = []
        for i, method in enumerate(methods or []):
            progress(i / len(methods), desc=f"measuring {scaling.METHODS.get(method, method)}")
            with engine.lock:
                new.append(_guard("measuring", scaling.measure_live, method, n))
        rows = [*rows, *new]
        both = committed + rows
        figure = scaling.plot(both, "Committed benchmark (lines) and live measurements (stars)")
        return figure, scaling.to_frame(rows + committed), rows

    button.click(
        measure_now,
        inputs=[tokens, methods, live],
        outputs=[plot, table, live],
        api_name="measure",
        concurrency_limit=1,
        concurrency_id=CONCURRENCY_ID,
    )


# ----------------------------------------------------------------------------------------------------------- app
def build_demo(config: AppConfig | None = None) -> gr.Blocks:
    engine = Engine(config)
    with gr.Blocks(title="NaLa", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(
            "# NaLa: Norm-Aware Linear Attention\n"
            "Linear-cost attention for images: super-resolution with NaLaSR, class-conditional generation with "
            "NaLaDiT, and how both scale with the number of tokens."
        )
        with gr.Tabs():
            with gr.Tab("Upscale", id="upscale"):
                up = build_upscale_tab(engine)
            with gr.Tab("Generate", id="generate"):
                gen = build_generate_tab(engine)
            with gr.Tab("Scaling", id="scaling"):
                build_scaling_tab(engine)
        for fn, inputs, outputs in (up["refresh"], gen["refresh"]):
            demo.load(fn, inputs, outputs, api_visibility="private")  # weights installed since start show up
    demo.engine = engine
    return demo


def launch(demo: gr.Blocks, config: AppConfig, host: str = "127.0.0.1", port: int | None = None, **kwargs):
    """Start the server (``prevent_thread_lock=True`` in ``kwargs`` returns at once, as the tests do)."""
    demo.queue(default_concurrency_limit=1)
    return demo.launch(
        server_name=host,
        server_port=port,
        theme=THEME,
        css=CSS,
        max_file_size=config.max_file_size,
        show_error=True,
        enable_monitoring=False,
        ssr_mode=False,
        share=False,
        footer_links=["api"],
        allowed_paths=[str(SAMPLE.parent)],
        **kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nala-app", description="The NaLa web app: upscale, generate, and attention scaling (Gradio)."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--max-pixels", type=int, default=AppConfig.max_pixels, help="refuse larger inputs (pixels)")
    parser.add_argument("--max-file-size", default=AppConfig.max_file_size, help="upload limit, e.g. 20mb")
    parser.add_argument("--pipeline", action="append", default=[], help="a diffusers pipeline folder (repeatable)")
    parser.add_argument(
        "--results", type=Path, default=AppConfig.results_dir, help="folder of committed benchmark results"
    )
    args = parser.parse_args(argv)
    if args.max_pixels < 4:
        parser.error("--max-pixels must be at least 4")
    for folder in args.pipeline:
        if not (Path(folder) / "model_index.json").is_file():
            parser.error(f"{folder} is not a diffusers pipeline folder (no model_index.json)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # gradio's own start-up probes of the local server
    config = AppConfig(
        max_pixels=args.max_pixels,
        max_file_size=args.max_file_size,
        pipelines=[str(Path(p).resolve()) for p in args.pipeline],
        results_dir=args.results,
    )
    launch(build_demo(config), config, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
