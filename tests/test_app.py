"""The web app (``nala-app``): a real browser session, the named API endpoints, limits and the Scaling tab.

The app runs in this process on a free loopback port, with tiny random weights (an x4 NaLaSR and a DiT pipeline)
found through ``NALA_GEN_WEIGHTS``. The browser test needs ``/usr/bin/chromium`` (``apt-get install chromium``).

``NALA_SAVE_SCREENSHOT=docs/app_screenshot.png`` also copies the Upscale screenshot there (the README's); with it,
``NALA_SCREENSHOT_MODEL`` (default ``nalasr-light-x4``) names installed weights to use for that picture instead of
the random ones, when they are installed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

gr = pytest.importorskip("gradio")
gradio_client = pytest.importorskip("gradio_client")

from PIL import Image  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "assets" / "chelsea_lr_x4.png"
CHROMIUM = Path("/usr/bin/chromium")
MAX_PIXELS = 100_000
SR_NAME, DIT_NAME = "tiny-nalasr-x4", "tiny-dit"
ID2LABEL = {i: name for i, name in enumerate("zero one two three four five six seven eight nine".split())}
CONNECTIONS: list = []
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# Installs a watcher that sets window.__progressSeen once a progress bar whose label contains the given text is in
# the page (added, or relabelled), however briefly.
_WATCH_PROGRESS = """(text) => {
    window.__progressSeen = false;
    const seen = () => [...document.querySelectorAll('[role=progressbar]')].some(
        (e) => (e.getAttribute('aria-label') || '').includes(text));
    const observer = new MutationObserver(() => {
        if (seen()) { window.__progressSeen = true; observer.disconnect(); }
    });
    const options = {subtree: true, childList: true, attributes: true, attributeFilter: ['aria-label']};
    observer.observe(document.body, options);
}"""


def make_tiny_weights(folder: Path) -> Path:
    """A random x4 NaLaSR (named ``tiny-nalasr-x4``) and a random pixel-space DiT pipeline (``tiny-dit``)."""
    import torch
    from diffusers import DDIMScheduler

    from nala_gen.diffusion import NaLaDiTPipeline, NaLaDiTTransformer2DModel
    from nala_gen.sr.loading import build_arch
    from nala_gen.weights import write_weights

    torch.manual_seed(0)
    config = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    net = build_arch("NaLaSR", config)
    write_weights(net.state_dict(), folder, SR_NAME, "sr", "NaLaSR", config, {"note": "random, for tests"})
    transformer = NaLaDiTTransformer2DModel.from_size(
        "tiny", sample_size=8, in_channels=3, num_classes=10, learn_sigma=False
    )
    NaLaDiTPipeline(transformer, DDIMScheduler(), id2label=ID2LABEL).save_pretrained(folder / DIT_NAME)
    card = {"name": DIT_NAME, "task": "diffusion", "arch": "NaLaDiT", "config": {}, "payload": DIT_NAME}
    (folder / f"{DIT_NAME}.json").write_text(json.dumps({**card, "sha256": "", "info": {}}))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_png(path: Path, height: int, width: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The app on a free loopback port: (url, demo)."""
    weights = make_tiny_weights(tmp_path_factory.mktemp("weights"))
    patch = pytest.MonkeyPatch()
    extra = os.environ.get("NALA_GEN_WEIGHTS", "")
    patch.setenv("NALA_GEN_WEIGHTS", os.pathsep.join(p for p in (str(weights), extra) if p))
    connect = socket.socket.connect

    def recording_connect(self, address, *args):
        CONNECTIONS.append(address)
        return connect(self, address, *args)

    patch.setattr(socket.socket, "connect", recording_connect)  # every connection this process opens
    from nala_gen.app.engine import AppConfig
    from nala_gen.app.ui import build_demo, launch

    config = AppConfig(max_pixels=MAX_PIXELS, max_file_size="2mb")
    demo = build_demo(config)
    port = free_port()
    launch(demo, config, port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/", demo
    demo.close()
    patch.undo()


@pytest.fixture(scope="module")
def client(app):
    from gradio_client import Client

    return Client(app[0], verbose=False)


# ------------------------------------------------------------------------------------------------------------ API
def upscale_args(path: Path, **overrides) -> dict:
    from gradio_client import handle_file

    args = {
        "image": handle_file(str(path)),
        "scale": "4",  # the API schema lists the scales as strings
        "model": SR_NAME,
        "tile_mode": "off",
        "tile_size": 256,
        "device": "cpu",
        "precision": "auto",
        "outscale": 0,
        "alpha": "model",
    }
    return {**args, **overrides}


def test_api_upscale_256x280_untiled(client, tmp_path):
    lr = write_png(tmp_path / "lr.png", 256, 280)
    (before, after), png, markdown, record = client.predict(**upscale_args(lr), api_name="/upscale")
    assert Image.open(png).size == (280 * 4, 256 * 4) and Image.open(png).format == "PNG"
    assert Image.open(after).size == Image.open(before).size == (280 * 4, 256 * 4)
    assert record["tiles"] == 1 and record["tokens"] == 71_680 and record["input_size"] == [280, 256]
    assert record["latency_s"] > 0 and record["peak_mem_bytes"] > 0
    assert "Latency" in markdown and "Peak memory" in markdown and "71,680" in markdown
    print(f"\n256x280 untiled x4 (tiny random NaLaSR): {json.dumps(record)}")


def test_api_upscale_errors(client, tmp_path):
    from gradio_client.exceptions import AppError

    big = write_png(tmp_path / "big.png", 400, 400)
    with pytest.raises(AppError, match=r"400x400 pixels, over the limit of 100,000"):
        client.predict(**upscale_args(big), api_name="/upscale")
    small = write_png(tmp_path / "small.png", 40, 40)
    with pytest.raises(AppError, match="unknown super-resolution model 'nope'"):
        client.predict(**upscale_args(small, model="nope"), api_name="/upscale")
    with pytest.raises(AppError, match="upscales x4, not x2"):
        client.predict(**upscale_args(small, scale="2"), api_name="/upscale")
    broken = tmp_path / "broken.png"
    broken.write_bytes(small.read_bytes()[:200])  # a truncated PNG: the header is fine, the pixels are not
    with pytest.raises(AppError, match=r"the upload \(broken.png\) is damaged"):
        client.predict(**upscale_args(broken), api_name="/upscale")
    text = tmp_path / "text.png"
    text.write_text("not an image")
    with pytest.raises(AppError, match=r"^the upload \(text.png\) is not an image file$"):
        client.predict(**upscale_args(text), api_name="/upscale")
    (_, after), _, _, record = client.predict(
        **upscale_args(small, tile_mode="size", tile_size=32, outscale=3.5), api_name="/upscale"
    )
    assert record["tiles"] == 4 and Image.open(after).size == (140, 140)


def test_api_upscale_video_keeps_frames_and_audio(client, tmp_path):
    import av
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from nala_gen.bench.upscale_folder import make_clip

    clip = make_clip(tmp_path / "clip.mp4", seconds=0.5, rate=12, size=(48, 40))
    video, markdown, record = client.predict(
        video=handle_file(str(clip)), model=SR_NAME, device="cpu", api_name="/upscale_video"
    )
    path = video["video"] if isinstance(video, dict) else video
    with av.open(path) as c:
        assert (c.streams.video[0].width, c.streams.video[0].height) == (192, 160) and c.streams.audio
        assert sum(1 for _ in c.decode(video=0)) == 6
    assert record["frames"] == 6 and record["audio"] == ["copied aac"] and "frames/s" in markdown
    long_clip = make_clip(tmp_path / "long.mp4", seconds=11, rate=2, size=(16, 16))
    with pytest.raises(AppError, match=r"limited to 10 s"):
        client.predict(video=handle_file(str(long_clip)), model=SR_NAME, device="cpu", api_name="/upscale_video")


def test_upload_size_limit(app, tmp_path):
    import httpx

    big = tmp_path / "big.png"
    big.write_bytes(os.urandom(3 * 2**20))  # over the fixture's 2 MB
    with open(big, "rb") as f:
        response = httpx.post(f"{app[0]}gradio_api/upload", files={"files": ("big.png", f, "image/png")})
    assert response.status_code == 413, response.text[:200]


def test_api_generate(client):
    args = {
        "model": DIT_NAME,
        "class_id": "3",
        "steps": 3,
        "guidance": 2.0,
        "scheduler": "dpm",
        "seed": 7,
        "num_images": 4,
        "device": "cpu",
    }
    image, png, markdown, record = client.predict(**args, api_name="/generate")
    assert Image.open(png).size == (16, 16)  # a 2 x 2 grid of 8 px samples, native size
    assert Image.open(image).size == (16 * 16, 16 * 16)  # enlarged for the page
    assert record["class_name"] == "three" and record["steps"] == 3 and record["batch"] == 8
    assert record["scheduler"] == "DPMSolverMultistepScheduler" and "Latency" in markdown
    again = client.predict(**args, api_name="/generate")[1]
    assert np.array_equal(np.asarray(Image.open(png)), np.asarray(Image.open(again)))  # same seed, same pixels
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="does not fit an epsilon"):
        client.predict(**{**args, "scheduler": "euler"}, api_name="/generate")


# -------------------------------------------------------------------------------------------------------- scaling
def test_scaling_rows():
    from nala_gen.app import scaling

    explicit = scaling.measure_live("softmax_explicit", 71_680, budget=2**30)
    assert explicit[0] == "computed" and explicit[3] is None and "164.4 GB" in explicit[5]
    assert "computed, not measured" in explicit[5]
    esrt = scaling.measure_live("esrt_split", 71_680, budget=2**30)
    assert esrt[0] == "computed" and esrt[4] == pytest.approx(2 * 4 * 17_920**2 * 4 / 2**20, rel=1e-3)
    assert scaling.measure_live("softmax_sdpa", 65_536)[0] == "skipped"
    for method in ("nala", "esrt_split", "naladit_step"):
        row = scaling.measure_live(method, 1024)
        assert row[0] == "live" and row[3] > 0, row
    committed = scaling.committed_attention(REPO / "benchmarks" / "results")
    if committed:
        assert any(r[0] == "committed" and r[2] == 71_680 for r in committed)
        assert scaling.plot(committed, "t") is not None


def test_upscale_tab_marks_the_chosen_model_on_the_peer_board(app):
    from nala_gen.app import scaling

    board = scaling.peer_board(REPO / "benchmarks" / "results")
    assert board is not None

    def labels(arch):
        return [t.get_text() for t in scaling.pareto_for(board, arch).axes[0].texts]

    assert "nalasr (chosen)" in labels("NaLaSR") and "esrt" in labels("NaLaSR")
    assert "esrt (chosen)" in labels("ESRT") and "nalasr" in labels("ESRT")
    assert not any("chosen" in t for t in labels("SomethingElse"))
    _, demo = app
    assert demo.engine.sr_arch(SR_NAME) == "NaLaSR" and demo.engine.sr_arch("no-such-model") is None
    plots = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "upscale-pareto"]
    assert len(plots) == 1


def test_one_job_at_a_time(app):
    """The heavy events share one queue slot, so two users never run two models at once."""
    events = {fn.api_name: fn for fn in app[1].fns.values() if fn.api_name in ("upscale", "generate", "measure")}
    assert sorted(events) == ["generate", "measure", "upscale"]
    assert {(fn.concurrency_id, fn.concurrency_limit) for fn in events.values()} == {("compute", 1)}


def test_api_measure(client):
    result = client.predict(tokens=1024, methods=["nala"], api_name="/measure")
    table = result[-1]
    row = dict(zip(table["headers"], table["data"][0], strict=True))  # this session's rows come first
    assert row["source"] == "live" and row["tokens"] == 1024 and row["latency (s)"] > 0


# -------------------------------------------------------------------------------------------------------- browser
def _image_sizes(page, selector: str) -> list[list[int]]:
    return page.evaluate(
        "sel => [...document.querySelectorAll(sel)].map(i => [i.naturalWidth, i.naturalHeight])", selector
    )


def _loaded(selector: str, count: int = 1) -> str:
    return (
        f"() => {{ const imgs = [...document.querySelectorAll({selector!r})]; return imgs.length >= {count} "
        "&& imgs.every(i => i.complete && i.naturalWidth > 0); }"
    )


def test_browser_session(app, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (CI installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    url, demo = app
    shot_target = os.environ.get("NALA_SAVE_SCREENSHOT")
    names = [name for name, _, _ in demo.engine.sr_models()]
    shot_model = os.environ.get("NALA_SCREENSHOT_MODEL", "nalasr-light-x4")
    model = shot_model if shot_target and shot_model in names else SR_NAME
    lr = Image.open(SAMPLE)
    requests: list[str] = []

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            page.on("request", lambda request: requests.append(request.url))
            page.goto(url)
            expect = sync_api.expect

            # Upscale: upload, pick the model and "off", run, check the output's natural size and the readout.
            page.locator("#upscale-input input[type=file]").set_input_files(str(SAMPLE))
            page.wait_for_function(_loaded("#upscale-input img"), timeout=20_000)
            if model != SR_NAME:
                page.locator("#upscale-model input").click()
                page.get_by_role("option", name=model).click()
            page.locator("#upscale-tile-mode").get_by_text("off", exact=True).click()
            page.locator("#upscale-button").click()
            page.wait_for_function(_loaded("#upscale-slider img", 2), timeout=60_000)
            expect(page.locator("#upscale-pareto")).to_be_visible()  # where the model sits among its peers
            sizes = _image_sizes(page, "#upscale-slider img")
            assert sizes and all(s == [lr.width * 4, lr.height * 4] for s in sizes), sizes
            readout = page.locator("#upscale-readout")
            expect(readout).to_contain_text("Latency")
            expect(readout).to_contain_text("Peak memory")
            expect(readout).to_contain_text("whole image, untiled")
            expect(page.locator("#upscale-file")).to_contain_text(".png")
            page.mouse.move(0, 0)
            time.sleep(0.3)
            shot = tmp_path / "upscale.png"
            page.screenshot(path=str(shot), full_page=True)
            if shot_target:
                target = Path(shot_target) if Path(shot_target).is_absolute() else REPO / shot_target
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, target)

            # An upload over the pixel limit gets the limit's message in the page.
            big = write_png(tmp_path / "big.png", 400, 400)
            page.locator("#upscale-input button[aria-label='Remove Image']").first.click()
            page.locator("#upscale-input input[type=file]").set_input_files(str(big))
            page.wait_for_function(_loaded("#upscale-input img"), timeout=20_000)
            page.locator("#upscale-button").click()
            expect(page.get_by_text("over the limit of 100,000").first).to_be_visible(timeout=20_000)

            # Generate: a few steps of the tiny DiT, an image and its readout.
            page.get_by_role("tab", name="Generate").click()
            steps = page.locator("#generate-steps input[type=number]")
            steps.fill("200")  # about a second: long enough to see the progress bar move over the steps
            steps.press("Enter")
            # The bar lives about a second; a poll can miss it on a loaded machine, so record it as it appears.
            page.evaluate(_WATCH_PROGRESS, "denoising")
            page.locator("#generate-button").click()
            page.wait_for_function("window.__progressSeen", timeout=60_000)
            page.wait_for_function(_loaded("#generate-output img"), timeout=60_000)
            assert _image_sizes(page, "#generate-output img")[0] == [256, 256]
            expect(page.locator("#generate-readout")).to_contain_text("Latency")
            expect(page.locator("#generate-readout")).to_contain_text("DDIMScheduler, 200")
            page.screenshot(path=str(tmp_path / "generate.png"), full_page=True)

            # Scaling: the committed table, with memory that cannot fit computed instead of run.
            page.get_by_role("tab", name="Scaling").click()
            if (REPO / "benchmarks" / "results" / "attention_scaling.json").is_file():
                expect(page.locator("#scaling-table")).to_contain_text("computed, not measured")
            page.screenshot(path=str(tmp_path / "scaling.png"), full_page=True)
        finally:
            browser.close()

    hosts = {urlparse(u).hostname for u in requests if urlparse(u).scheme in ("http", "https", "ws", "wss")}
    assert requests and hosts <= {"127.0.0.1", "localhost"}, sorted(u for u in requests if "127.0.0.1" not in u)


def test_no_outside_connection_from_the_server(app):
    """Start-up and every request above opened connections to the loopback interface only (last in this file)."""
    hosts = {a[0] for a in CONNECTIONS if isinstance(a, tuple)}
    assert hosts <= {"127.0.0.1", "localhost", "::1"}, sorted(hosts)


def test_generate_tab_lists_nala_models_before_their_softmax_twin():
    from nala_gen.app.engine import AppConfig, Engine
    from nala_gen.weights import resolve

    listed = Engine(AppConfig()).diffusion_models()
    kinds = [resolve(spec).config.get("kernel") for spec, _ in listed]
    assert "softmax" in kinds and kinds[0] != "softmax"  # the tab opens on the first one
    assert kinds == sorted(kinds, key=lambda k: k == "softmax")
    # The twin stays selectable, labelled as the baseline; no NaLa model is.
    assert [label.endswith("softmax baseline") for _, label in listed] == [k == "softmax" for k in kinds]
