"""``nala-sr upscale`` end to end on small generated images, and the tiled engine."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from nala_gen.profiling import PeakMemory
from nala_gen.sr.cli import main
from nala_gen.sr.loading import build_arch
from nala_gen.sr.upscale.engine import MIN_TILE, Upscaler, feather, tile_starts, tokens_within
from nala_gen.sr.upscale.imageio import read_image, write_image_atomic
from nala_gen.weights import WeightsError, resolve, write_weights

TINY = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    for scale in (2, 4):
        config = {**TINY, "upscale": scale}
        state = build_arch("NaLaSR", config).state_dict()
        write_weights(state, folder, f"tiny-x{scale}", "sr", "NaLaSR", config, {"trained_on": "nothing"})
    # A card whose config does not match its payload (two HPBs declared, one stored).
    wrong = folder / "wrong"
    wrong.mkdir()
    state = build_arch("NaLaSR", TINY).state_dict()
    write_weights(state, wrong, "wrong-x4", "sr", "NaLaSR", {**TINY, "num_block": 2}, {})
    return folder


def rng_image(shape, dtype=np.uint8, seed=0):
    # Smooth content (a real photo is not white noise): upsampled random blocks.
    rng = np.random.default_rng(seed)
    h, w = shape[:2]
    small = rng.random((max(h // 6, 2), max(w // 6, 2), *shape[2:]))
    big = np.asarray(
        torch.nn.functional.interpolate(
            torch.from_numpy(small).reshape(1, 1, *small.shape[:2], -1).permute(0, 4, 2, 3, 1)[..., 0],
            size=(h, w),
            mode="bilinear",
            align_corners=False,
        )[0].permute(1, 2, 0)
    )
    big = big.reshape(shape)
    return np.round(big * np.iinfo(dtype).max).astype(dtype)


def save(img, path):
    return write_image_atomic(img, path)


def run(args, capsys):
    code = main(["upscale", *map(str, args), "-q"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((20, 26, 3), np.uint8), ((20, 26, 4), np.uint8), ((20, 26), np.uint8), ((20, 26), np.uint16)],
    ids=["rgb", "rgba", "gray", "gray16"],
)
def test_channels_and_depth_are_kept(tmp_path, weights, capsys, shape, dtype):
    src = save(rng_image(shape, dtype), tmp_path / "in.png")
    out = tmp_path / "out.png"
    code, _, err = run([src, "-o", out, "-m", weights / "tiny-x4.json"], capsys)
    assert code == 0, err
    result = read_image(out)
    assert result.shape == (80, 104, *shape[2:])
    assert result.dtype == dtype
    if dtype == np.uint16:
        assert result.max() > 255  # not flattened to 8 bits


def test_rgb16_is_kept(tmp_path, weights, capsys):
    src = save(rng_image((16, 18, 3), np.uint16), tmp_path / "in16.png")
    code, _, err = run([src, "-o", tmp_path / "o.png", "-m", weights / "tiny-x4.json"], capsys)
    assert code == 0, err
    result = read_image(tmp_path / "o.png")
    assert result.dtype == np.uint16 and result.shape == (64, 72, 3) and result.max() > 255


def test_alpha_option_takes_effect(tmp_path, weights, capsys):
    img = rng_image((20, 26, 4))
    img[..., 3] = np.where(np.arange(26)[None, :] < 13, 255, 0)  # a sharp transparency edge
    src = save(img, tmp_path / "in.png")
    outputs = {}
    for mode in ("model", "bicubic"):
        out = tmp_path / f"{mode}.png"
        assert run([src, "-o", out, "-m", weights / "tiny-x4.json", "--alpha", mode], capsys)[0] == 0
        outputs[mode] = read_image(out)
    assert not np.array_equal(outputs["model"][..., 3], outputs["bicubic"][..., 3])
    np.testing.assert_array_equal(outputs["model"][..., :3], outputs["bicubic"][..., :3])


def test_exif_orientation_is_applied(tmp_path, weights, capsys):
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, displayed rotated 90 degrees clockwise
    src = tmp_path / "rotated.jpg"
    Image.fromarray(rng_image((12, 20, 3))).save(src, exif=exif.tobytes(), quality=95)
    out = tmp_path / "out.png"
    assert run([src, "-o", out, "-m", weights / "tiny-x4.json"], capsys)[0] == 0
    assert read_image(out).shape == (80, 48, 3)  # upright: 12 wide, 20 tall, times 4


def test_outscale_gives_the_exact_size(tmp_path, weights, capsys):
    src = save(rng_image((21, 17, 3)), tmp_path / "in.png")
    out = tmp_path / "out.png"
    assert run([src, "-o", out, "-m", weights / "tiny-x4.json", "--outscale", "3.5"], capsys)[0] == 0
    assert read_image(out).shape == (round(21 * 3.5), round(17 * 3.5), 3)


class LocalSR(torch.nn.Module):
    """A model whose every output pixel depends on a 5x5 input neighbourhood (two 3x3 convs)."""

    def __init__(self, scale: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GELU(), torch.nn.Conv2d(8, 3 * scale**2, 3, padding=1)
        )
        self.shuffle = torch.nn.PixelShuffle(scale)

    def forward(self, x):
        return torch.sigmoid(self.shuffle(self.body(x)))


def test_tiled_blending_leaves_no_seams():
    # With a local model and an overlap wider than its receptive field, every tile sees the same context as
    # the whole image, so any difference would come from the blending itself: there is none beyond rounding.
    img = rng_image((70, 90, 3))
    whole, r1 = Upscaler(LocalSR(), 4, tile=0).upscale(img)
    tiled, r2 = Upscaler(LocalSR(), 4, tile=32, tile_pad=4).upscale(img)
    assert r1.tiles == 1 and r2.tiles == 12 and r2.tokens == 32 * 32
    assert np.abs(whole.astype(int) - tiled.astype(int)).max() <= 1


def test_feather_weights_cover_everything():
    starts = tile_starts(100, 32, 8)
    assert starts[0] == 0 and starts[-1] == 68
    total = np.zeros(100)
    for s in starts:
        total[s : s + 32] += feather(32, s, s + 32, 100, 8)
    assert (total > 0.99).all()  # the cross-fades are complementary: every pixel is fully covered
    np.testing.assert_allclose(total[:60], np.ones(60), atol=2e-3, rtol=0)


def test_auto_tiles_follow_the_memory_budget(weights, monkeypatch):
    model = build_arch("NaLaSR", TINY)
    roomy = Upscaler(model, 4, memory_budget=8 * 2**30)
    assert roomy.tile_size(200, 200) == 0
    probes = []
    monkeypatch.setattr(Upscaler, "_probe", lambda self, side: probes.append(side) or 1)
    tight = Upscaler(model, 4, memory_budget=24 * 2**20)
    assert 32 <= tight.tile_size(200, 200) < 200
    assert probes == []  # the same network was probed once, whatever the budget


def test_memory_model_solves_quadratic_costs_and_bounds_linear_ones():
    tokens = [48**2, 96**2, 128**2]
    budget = 4 * 2**30

    def quadratic(n):  # softmax attention: the cost per token grows
        return 100e6 + 2e3 * n + 5.0 * n * n

    n = tokens_within(budget, tokens, [quadratic(t) for t in tokens])
    assert quadratic(n) <= budget < quadratic(n + 1)  # the largest count that fits

    def linear(n):  # convolutions and linear attention
        return 50e6 + 9e3 * n

    n = tokens_within(budget, tokens, [linear(t) for t in tokens])
    # Safe, and within what the fixed cost (here 25 % of the largest probe) counted per token gives away.
    assert linear(n) <= budget and n > 0.7 * (budget - 50e6) / 9e3
    # Noisy small probes (RSS, +-20 MiB) must not read as quadratic, nor shrinking ones as free memory.
    noisy = [36e6, 96e6, 179e6]  # NaLaSR-light x4 measured here: per token x1.05 from 96 to 128 px
    assert tokens_within(budget, tokens, noisy) == int(budget / (179e6 / 128**2))
    assert tokens_within(budget, tokens, [300e6, 200e6, 100e6]) == int(budget / (100e6 / 128**2))
    assert tokens_within(10**8, tokens, [2e8, 3e8, 4e8]) == MIN_TILE * MIN_TILE  # even the smallest probe is over


def test_auto_tiles_keep_a_quadratic_model_within_its_budget():
    # ESRT's split softmax grows with the square of the tokens, which small probes hardly show (x1.1 from 48 to
    # 96 px): a power law through them chose 124 px tiles for a 1 GiB budget, whose pass took 1.43 GiB.
    from nala_gen.sr.loading import load_sr_model

    model, _ = load_sr_model("esrt-x4", 4)
    engine = Upscaler(model, 4, memory_budget=2**30)
    tile = engine.tile_size(400, 400)
    assert MIN_TILE < tile < 400
    with PeakMemory() as memory:
        engine._forward(torch.rand(1, 3, tile, tile))
    assert 0.5 * 2**30 < memory.peak_bytes < 1.15 * 2**30, (tile, memory.peak_bytes / 2**30)


def test_json_readout(tmp_path, weights, capsys):
    srcs = [save(rng_image((16, 20, 3), seed=i), tmp_path / f"{i}.png") for i in range(2)]
    code, out, err = run([*srcs, "-o", tmp_path / "out", "-m", weights / "tiny-x4.json", "--json"], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 2
    for record in records:
        assert record["status"] == "ok" and record["tokens"] == 16 * 20
        assert record["latency_s"] > 0 and record["estimate_mib"] > 0
        # The job's peak is part of the process's (which holds torch and the model: well over 100 MiB).
        assert record["process_peak_mib"] > 100 and record["peak_mem_mib"] <= record["process_peak_mib"]
        assert read_image(record["output"]).shape == (64, 80, 3)


def test_folders_and_globs(tmp_path, weights, capsys):
    (tmp_path / "in").mkdir()
    for i in range(2):
        save(rng_image((12, 12, 3), seed=i), tmp_path / "in" / f"{i}.png")
    (tmp_path / "in" / "notes.txt").write_text("not an image")
    assert run([tmp_path / "in", "-o", tmp_path / "a", "-m", weights / "tiny-x4.json"], capsys)[0] == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["0_x4.png", "1_x4.png"]
    assert run([str(tmp_path / "in" / "*.png"), "-o", tmp_path / "b", "-m", weights / "tiny-x4.json"], capsys)[0] == 0
    assert len(list((tmp_path / "b").iterdir())) == 2


def bad_inputs(tmp_path):
    good = save(rng_image((12, 12, 3)), tmp_path / "good.png")
    text = tmp_path / "text.png"
    text.write_text("this is not a picture")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    return {"missing": tmp_path / "missing.png", "text": text, "truncated": truncated}


@pytest.mark.parametrize("case", ["missing", "text", "truncated"])
def test_bad_images_fail_cleanly(tmp_path, weights, capsys, case):
    src = bad_inputs(tmp_path)[case]
    out = tmp_path / "out.png"
    code, _, err = run([src, "-o", out, "-m", weights / "tiny-x4.json"], capsys)
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "error" in err
    assert not out.exists() and not list(tmp_path.glob(".*.part"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "WEIGHTS/wrong/wrong-x4.json"], "does not match NaLaSR"),
        (["-m", "WEIGHTS/tiny-x4.json", "--scale", "2"], "upscales x4, not x2"),
        (["--scale", "3"], "no default model for x3"),
        (["-m", "no-such-model"], "unknown super-resolution weights"),
        (["-m", "WEIGHTS/tiny-x4.json", "--precision", "fp16", "--device", "cpu"], "fp16 is not supported on CPU"),
    ],
)
def test_bad_models_fail_cleanly(tmp_path, weights, capsys, args, message):
    src = save(rng_image((12, 12, 3)), tmp_path / "in.png")
    out = tmp_path / "out.png"
    args = [a.replace("WEIGHTS", str(weights)) for a in args]
    code, _, err = run([src, "-o", out, *args], capsys)
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not out.exists()


def test_bf16_on_a_cpu_is_native_or_refused_in_one_line(tmp_path, weights, capsys):
    from nala_gen.devices import cpu_native_bf16

    assert cpu_native_bf16(frozenset({"avx2", "avx512f", "avx512_bf16"}))
    assert cpu_native_bf16(frozenset({"avx2", "amx_tile", "amx_bf16"}))
    assert not cpu_native_bf16(frozenset({"avx2", "fma", "avx512f", "avx512bw"}))  # emulated there
    src = save(rng_image((12, 12, 3)), tmp_path / "in.png")
    out = tmp_path / "out.png"
    args = ["-m", weights / "tiny-x4.json", "--precision", "bf16", "--device", "cpu"]
    code, _, err = run([src, "-o", out, *args], capsys)
    if cpu_native_bf16():
        assert code == 0 and out.is_file(), err
    else:
        assert code == 1 and len(err.strip().splitlines()) == 1 and "AVX512_BF16 or AMX" in err
        assert not out.exists()


def test_a_corrupted_payload_is_refused(tmp_path, weights):
    import shutil

    for suffix in (".json", ".safetensors"):
        shutil.copy(weights / f"tiny-x4{suffix}", tmp_path / f"tiny-x4{suffix}")
    payload = tmp_path / "tiny-x4.safetensors"
    data = bytearray(payload.read_bytes())
    data[-1] ^= 0xFF
    payload.write_bytes(bytes(data))
    from nala_gen.weights import load_state_dict

    with pytest.raises(WeightsError, match="sha256"):
        load_state_dict(resolve(str(tmp_path / "tiny-x4.json")))


def test_never_overwrites_an_input(tmp_path, weights, capsys):
    src = save(rng_image((12, 12, 3)), tmp_path / "in.png")
    before = src.read_bytes()
    code, _, err = run([src, "-o", src, "-m", weights / "tiny-x4.json"], capsys)
    assert code == 1 and "overwrite" in err
    assert src.read_bytes() == before


def test_exit_status_of_the_console_script(tmp_path, weights):
    good = save(rng_image((12, 12, 3)), tmp_path / "good.png")
    cmd = [
        sys.executable,
        "-m",
        "nala_gen.sr.cli",
        "upscale",
        str(good),
        str(tmp_path / "missing.png"),
        "-o",
        str(tmp_path / "out"),
        "-m",
        str(weights / "tiny-x4.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 1  # one of two inputs failed
    assert (tmp_path / "out" / "good_x4.png").exists()
    assert "missing.png" in proc.stderr


def test_tiled_and_untiled_agree_with_the_shipped_model():
    # Measured with the shipped nalasr-light-x4 (6,954 iterations) on the bundled 90x75 sample (x4, 8-bit): tiles of
    # 48 with 16 px overlap give max |tiled - untiled| = 22/255 and mean 0.66/255 (tiles of 32: 23 and 0.80; of 64:
    # 21 and 0.54). NaLaSR's attention and channel attention are global, so a tile sees less context than the
    # whole image; the differences are small and spread out, not seams (the blending itself is exact: see the
    # local-model test).
    from pathlib import Path

    from nala_gen.sr.loading import load_sr_model

    model, _ = load_sr_model("nalasr-light-x4", 4)
    lr = read_image(Path(__file__).resolve().parents[1] / "assets" / "chelsea_lr_x4.png")
    whole, _ = Upscaler(model, 4, tile=0).upscale(lr)
    tiled, readout = Upscaler(model, 4, tile=48, tile_pad=16).upscale(lr)
    diff = np.abs(whole.astype(int) - tiled.astype(int))
    assert readout.tiles > 1
    assert diff.max() <= 30 and diff.mean() <= 1.0, (diff.max(), diff.mean())


def test_atomic_writes_get_the_permissions_of_a_plain_write(tmp_path):
    import stat

    from nala_gen.fileio import write_atomic

    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"x")
    atomic = write_atomic(tmp_path / "atomic.bin", b"x")
    assert stat.S_IMODE(atomic.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    assert atomic.read_bytes() == b"x" and [p.name for p in tmp_path.iterdir() if p.suffix == ".part"] == []


def test_upscaling_imports_neither_basicsr_nor_torchvision(tmp_path, weights):
    # The archs and the engine need torch only; BasicSR (and the torchvision it drags in) load for training only.
    img = tmp_path / "in.png"
    save(rng_image((12, 10, 3)), img)
    code = (
        "import sys\n"
        "from nala_gen.sr.cli import main\n"
        f"assert main(['upscale', {str(img)!r}, '-m', {str(weights / 'tiny-x4.json')!r}, '-q']) == 0\n"
        "print(sorted(m for m in ('basicsr', 'torchvision') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "in_x4.png").is_file()


@pytest.mark.parametrize("size", [(13, 10), (5, 3), (16, 8)])
def test_a_window_attention_network_takes_any_size(size):
    # BasicSR's SwinIR needs sides that are multiples of its window: the engine reflect-pads the input and crops the
    # output back (as SwinIR's own test code does), so any image size upscales to exactly scale x its size.
    from nala_gen.sr.loading import build_arch
    from nala_gen.sr.upscale.engine import Upscaler, size_multiple

    torch.manual_seed(0)
    config = {"upscale": 2, "img_size": 16, "window_size": 4, "embed_dim": 12, "depths": [1], "num_heads": [2],
              "mlp_ratio": 1, "upsampler": "pixelshuffledirect", "img_range": 1.0}  # fmt: skip
    net = build_arch("SwinIR", config)
    assert size_multiple(net) == 4
    img = np.random.default_rng(1).integers(0, 256, (*size, 3), dtype=np.uint8)
    out, readout = Upscaler(net, 2, "cpu", tile=0).upscale(img)
    assert out.shape == (2 * size[0], 2 * size[1], 3)
    # inside the image, away from the padded edge, the output is the network's on the reflect-padded input
    h, w = size
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255
    padded = torch.nn.functional.pad(
        x, (0, -w % 4, 0, -h % 4), mode="reflect" if max(-h % 4 - h, -w % 4 - w) < 0 else "replicate"
    )
    with torch.no_grad():
        ref = net(padded)[0, :, : 2 * h, : 2 * w].clamp(0, 1).permute(1, 2, 0).numpy()
    assert np.abs(out.astype(np.float64) - np.round(ref * 255)).max() <= 1


def _interrupt_at_opcode(n: int, files: tuple[str, ...]):
    """A trace function raising KeyboardInterrupt at the ``n``-th opcode run in ``files`` (as a signal handler
    can, between any two bytecodes of the main thread)."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if not frame.f_code.co_filename.endswith(files):
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
            if count == n:
                raise KeyboardInterrupt
        return trace

    return trace


def test_an_interruption_at_any_bytecode_of_an_atomic_write_leaves_no_temporary_file(tmp_path):
    # A fresh clone's CI once found a `.part` left by a SIGTERM that landed between `mkstemp` creating the file
    # and the `try` that removes it. Raise at every opcode of the write in turn, as a signal handler may.
    import sys

    from nala_gen.fileio import write_atomic

    target = tmp_path / "out.bin"
    interrupted = 0
    for n in range(1, 5000):
        sys.settrace(_interrupt_at_opcode(n, ("fileio.py", "contextlib.py")))
        try:
            write_atomic(target, b"data")
        except KeyboardInterrupt:
            interrupted += 1
        else:
            break
        finally:
            sys.settrace(None)
        # Nothing half-written (an interruption after the rename leaves the whole file) and nothing else left.
        assert not target.exists() or target.read_bytes() == b"data", n
        assert [p.name for p in tmp_path.iterdir() if p != target] == [], n
        target.unlink(missing_ok=True)
    assert interrupted > 50 and target.read_bytes() == b"data"
