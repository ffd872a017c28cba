"""Video: frames streamed through the engine, chunked encode that resumes, audio carried over, bad input."""

import json
import subprocess
import sys

import av
import numpy as np
import pytest
import torch

from nala_gen.bench.upscale_folder import make_clip
from nala_gen.sr.jobs.video import VideoError, probe, upscale_video
from nala_gen.sr.loading import build_arch
from nala_gen.sr.upscale.engine import Upscaler
from nala_gen.weights import write_weights

TINY = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}


def tiny_net():
    torch.manual_seed(0)
    return build_arch("NaLaSR", TINY).eval()


def decoded(path):
    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    with av.open(str(path)) as c:
        audio = np.concatenate([f.to_ndarray() for f in c.decode(audio=0)], axis=1) if c.streams.audio else None
    return frames, audio


@pytest.fixture()
def clip(tmp_path):
    return make_clip(tmp_path / "clip.mp4", seconds=1.0, rate=12, size=(48, 40), tone_hz=440.0)


def test_a_clip_upscales_with_its_frame_count_rate_and_audio(tmp_path, clip):
    write_weights(tiny_net().state_dict(), tmp_path / "w", "tiny-x4", "sr", "NaLaSR", TINY, {})
    out = tmp_path / "clip_x4.mp4"
    cmd = [sys.executable, "-m", "nala_gen.sr.cli", "upscale", str(clip), "-o", str(out), "--json", "-q"]
    cmd += ["-m", str(tmp_path / "w" / "tiny-x4.json"), "--chunk-seconds", "0.5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.splitlines()[-1])
    assert record["status"] == "ok" and record["frames"] == 12 and record["chunks"] == 2
    assert record["audio"] == ["copied aac"] and record["output_size"] == [192, 160]
    info = probe(out)
    assert (info.width, info.height, info.rate) == (192, 160, 12)
    frames, audio = decoded(out)
    source_frames, source_audio = decoded(clip)
    assert len(frames) == len(source_frames) == 12
    assert audio.shape == source_audio.shape  # the same samples: the packets were copied
    np.testing.assert_array_equal(audio, source_audio)
    # The tone is still 440 Hz.
    spectrum = np.abs(np.fft.rfft(audio[0]))
    assert abs(np.argmax(spectrum) * 48000 / len(audio[0]) - 440) < 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4", "clip_x4.mp4", "w"]  # no parts left


class StopAfter(torch.nn.Module):
    """The network, interrupted (as by Ctrl-C) on its ``limit``-th frame."""

    def __init__(self, net, limit):
        super().__init__()
        self.net, self.limit, self.calls = net, limit, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.limit:
            raise KeyboardInterrupt
        return self.net(x)


def test_an_interrupted_video_resumes_from_its_last_whole_chunk(tmp_path, clip):
    # Lossless FFV1, so that the resumed video's frames can be compared with an uninterrupted run's exactly (x264
    # with several threads need not repeat its bits from one run to the next). The engine runs a NaLaSR through its
    # fast inference form; the counting wrappers below hide the network, so all three runs get the form itself.
    net = tiny_net().inference_form()
    whole = tmp_path / "whole.mkv"
    upscale_video(Upscaler(net, 4, tile=0), clip, whole, codec="ffv1", chunk_seconds=0.25)  # 3 frames a chunk
    out = tmp_path / "resumed.mkv"
    stopping = StopAfter(net, limit=8)  # chunks 0 and 1 (frames 1-6) finish, chunk 2 is cut in its 2nd frame
    with pytest.raises(KeyboardInterrupt):
        upscale_video(Upscaler(stopping, 4, tile=0), clip, out, codec="ffv1", chunk_seconds=0.25)
    parts = tmp_path / ".resumed.mkv.parts"
    assert not out.exists()
    assert sorted(p.name for p in parts.iterdir()) == ["chunk_000000.mp4", "chunk_000001.mp4", "job.json"]
    counting = StopAfter(net, limit=10**9)
    readout = upscale_video(Upscaler(counting, 4, tile=0), clip, out, codec="ffv1", chunk_seconds=0.25)
    assert readout.chunks == 4 and readout.chunks_reused == 2 and counting.calls == 6  # only chunks 2 and 3
    assert not parts.exists()
    (a, _), (b, _) = decoded(whole), decoded(out)
    assert len(a) == len(b) == 12
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_changed_settings_start_the_chunks_afresh(tmp_path, clip):
    net = tiny_net()
    out = tmp_path / "o.mp4"
    with pytest.raises(KeyboardInterrupt):
        upscale_video(Upscaler(StopAfter(net, 8), 4, tile=0), clip, out, chunk_seconds=0.25, settings={"model": "a"})
    counting = StopAfter(net, 10**9)
    readout = upscale_video(Upscaler(counting, 4, tile=0), clip, out, chunk_seconds=0.25, settings={"model": "b"})
    assert readout.chunks_reused == 0 and counting.calls == 12


def test_bad_video_input_and_settings_are_one_line_errors(tmp_path, clip):
    write_weights(tiny_net().state_dict(), tmp_path / "w", "tiny-x4", "sr", "NaLaSR", TINY, {})
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 4)
    cases = [
        ([str(broken)], "is not a video file or is damaged"),
        ([str(tmp_path / "missing.mp4")], "no such file"),
        ([str(clip), "--codec", "libnothing"], "unknown codec"),
        ([str(clip), "-o", str(tmp_path / "x.webm")], "cannot hold libx264"),
        ([str(clip), "--outscale", "3.1"], "even width and height"),
    ]
    for args, message in cases:
        cmd = [sys.executable, "-m", "nala_gen.sr.cli", "upscale", *args, "-m", str(tmp_path / "w" / "tiny-x4.json")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and message in lines[0], (args, proc.stderr)
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == ["broken.mp4", "clip.mp4", "w"]  # nothing half-written
    with pytest.raises(VideoError, match="overwrite the input"):
        upscale_video(Upscaler(tiny_net(), 4, tile=0), clip, clip)
