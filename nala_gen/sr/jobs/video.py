"""Upscale a video: frames streamed through the image engine, encoded in resumable chunks, audio carried over.

    nala-sr upscale clip.mp4 --scale 4 -o clip_x4.mp4 [--codec libx264] [--crf 18] [--chunk-seconds 4]

Decoding and encoding go through PyAV (FFmpeg's libraries, bundled in its wheels): frames come one at a time,
so a video is never held whole in memory (the encoder's own look-ahead, a few dozen output frames for x264,
aside), and no ``ffmpeg`` program needs to be installed. PyAV rather than imageio-ffmpeg: imageio pipes raw
frames to an ffmpeg process and cannot copy the audio packets, which PyAV remuxes untouched.

* **Frames.** Every decoded frame is upscaled by :class:`~nala_gen.sr.upscale.engine.Upscaler` (tiles, memory budget,
  precision as for images) and encoded at the input's average frame rate, so the frame count and the duration
  are kept (a variable-rate input comes out at its average, constant rate).
* **Audio.** Each audio stream is copied packet for packet when the output container takes its codec, else
  re-encoded to AAC (Opus for WebM).
* **Resume.** Frames are encoded in chunks of ``chunk_seconds`` into ``.<output name>.parts/`` beside the output,
  each chunk written atomically; a job started again with the same command and settings reuses the finished
  chunks and redoes only the one that was in flight. The output file itself appears, atomically, only when
  every chunk is done (the chunks' packets are joined without re-encoding); then the parts folder is removed.
"""

from __future__ import annotations

import heapq
import io
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from nala_gen.fileio import VIDEO_SUFFIXES, PathError, atomic_file, check_readable, real_path, write_atomic

# codec -> (pixel format, quality options from the CRF); ffv1 is lossless and ignores the CRF
CODECS: dict[str, tuple[str, Callable[[int], dict]]] = {
    "libx264": ("yuv420p", lambda crf: {"crf": str(crf), "preset": "medium"}),
    "libx265": ("yuv420p", lambda crf: {"crf": str(crf), "preset": "medium", "x265-params": "log-level=error"}),
    "libvpx-vp9": ("yuv420p", lambda crf: {"crf": str(crf), "b": "0"}),
    "libsvtav1": ("yuv420p", lambda crf: {"crf": str(crf)}),
    "ffv1": ("yuv444p", lambda crf: {}),
}
FORMATS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "webm", ".avi": "avi"}
CHUNK_FORMAT = "mp4"  # holds every codec above, with decode timestamps (Matroska stores none)


class VideoError(ValueError):
    """A video that cannot be read, a codec that is not available, a setting the container cannot hold."""


def is_video(path: str | Path) -> bool:
    return Path(path).suffix.lower() in VIDEO_SUFFIXES


def _av():
    try:
        import av
    except ImportError:
        raise VideoError("video needs PyAV: pip install 'nala_gen[video]'") from None
    # FFmpeg logs its own lines on stderr (warnings, and errors that PyAV raises anyway): one line per problem is ours.
    av.logging.set_level(av.logging.PANIC)
    return av


@dataclass
class VideoInfo:
    width: int
    height: int
    frames: int  # from the container's header; 0 when it does not say
    rate: Fraction  # frames per second
    audio: list[str]  # codec names of the audio streams


@dataclass
class VideoReadout:
    frames: int
    chunks: int
    chunks_reused: int
    compute_s: float  # wall time of decoding, upscaling and encoding the chunks made by this run
    input_size: tuple[int, int]
    output_size: tuple[int, int]
    rate: str
    audio: list[str]  # per audio stream: "copied <codec>" or "re-encoded <from> -> <to>"

    @property
    def frames_per_s(self) -> float:
        made = self.frames * (self.chunks - self.chunks_reused) / max(self.chunks, 1)
        return made / self.compute_s if self.compute_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "frames_per_s": round(self.frames_per_s, 3)}


def probe(path: str | Path) -> VideoInfo:
    """What :func:`upscale_video` needs to know of a video, or :class:`VideoError` with a one-line reason."""
    av = _av()
    if os.path.lexists(path):  # a symlink loop, a dangling link, an unreadable file or a folder: said as such
        try:
            check_readable(path, folder=False)
        except PathError as err:
            raise VideoError(str(err)) from None
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError(f"{path} has no video stream")
            video = container.streams.video[0]
            rate = video.average_rate or video.guessed_rate or video.base_rate
            if not rate or video.codec_context.width < 2 or video.codec_context.height < 2:
                raise VideoError(f"{path}: its video stream has no frame rate or size")
            audio = [s.codec_context.name for s in container.streams.audio]
            return VideoInfo(video.codec_context.width, video.codec_context.height, video.frames, Fraction(rate), audio)
    except FileNotFoundError:
        raise VideoError(f"cannot read {path}: no such file") from None
    except av.FFmpegError as err:
        raise VideoError(f"{path} is not a video file or is damaged ({err.strerror or err})") from None


def frames_of(path: str | Path) -> Iterator[np.ndarray]:
    """The video's frames in order, as (H, W, 3) uint8 RGB, one at a time."""
    av = _av()
    try:
        with av.open(str(path)) as container:
            for frame in container.decode(video=0):
                yield frame.to_ndarray(format="rgb24")
    except av.FFmpegError as err:
        raise VideoError(f"{path}: decoding failed ({err.strerror or err})") from None


def _chunk_settings(src: Path, settings: dict, codec: str, crf: int, frames_per_chunk: int) -> dict:
    stat = src.stat()
    source = {"path": str(src.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return {"source": source, "settings": settings, "codec": codec, "crf": crf, "frames_per_chunk": frames_per_chunk}


class _ChunkEncoder:
    """One chunk file being encoded, a frame at a time; it appears at ``path`` only once closed whole."""

    def __init__(self, path: Path, codec: str, crf: int, rate: Fraction, height: int, width: int) -> None:
        av = _av()
        self._file_context = atomic_file(path)
        self._file = self._file_context.__enter__()
        self.container = av.open(self._file, "w", format=CHUNK_FORMAT)
        pix_fmt, options = CODECS[codec]
        self.stream = self.container.add_stream(codec, rate=rate, options=options(crf))
        self.stream.height, self.stream.width = height, width
        self.stream.pix_fmt = pix_fmt
        self.stream.codec_context.time_base = 1 / rate
        self.rate = rate
        self.count = 0

    def add(self, pixels: np.ndarray) -> None:
        av = _av()
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
        frame.pts, frame.time_base = self.count, 1 / self.rate
        self.container.mux(self.stream.encode(frame))
        self.count += 1

    def close(self) -> None:
        self.container.mux(self.stream.encode(None))
        self.container.close()
        self._file_context.__exit__(None, None, None)

    def abandon(self) -> None:
        """Drop the unfinished chunk (its temporary file is removed)."""
        try:
            self.container.close()
        except Exception:  # noqa: BLE001 - the encoder may be in any state; the file goes either way
            pass
        try:
            self._file_context.__exit__(RuntimeError, RuntimeError("abandoned"), None)
        except RuntimeError:
            pass


def _demuxed(container, stream, target, offset_s: Fraction = Fraction(0)) -> Iterator[tuple[Fraction, object]]:
    """(time in seconds, packet) of one input stream, shifted by ``offset_s`` and re-addressed to the output
    stream ``target``; flush packets (no dts) left out."""
    offset = round(offset_s / stream.time_base)
    for packet in container.demux(stream):
        if packet.dts is None:
            continue
        if packet.pts is not None:
            packet.pts += offset
        packet.dts += offset
        packet.stream = target
        yield packet.dts * stream.time_base, packet


def _chunk_packets(chunks: list, frames_per_chunk: int, rate: Fraction, target) -> Iterator[tuple[Fraction, object]]:
    """The chunks' video packets one after another, each chunk shifted to its first frame's time."""
    for k, chunk in enumerate(chunks):
        yield from _demuxed(chunk, chunk.streams.video[0], target, Fraction(k * frames_per_chunk) / rate)


def _reencoded(src: Path, index: int, target) -> Iterator[tuple[Fraction, object]]:
    """One audio stream of ``src`` decoded and encoded into ``target`` (a codec the container takes)."""
    av = _av()
    with av.open(str(src)) as source:
        stream = source.streams[index]
        for frame in [*source.decode(stream), None]:
            for packet in target.encode(frame):
                yield (packet.pts or 0) * packet.time_base, packet


def _join(chunks: list[Path], frames_per_chunk: int, rate: Fraction, src: Path, dst: Path) -> list[str]:
    """The chunks' video packets and the input's audio, interleaved by time, into ``dst`` (atomically).
    Returns what happened to each audio stream."""
    av = _av()
    fmt = FORMATS[dst.suffix.lower()]
    notes = []
    opened = [av.open(str(c)) for c in chunks]
    try:
        with av.open(str(src)) as source, atomic_file(dst) as f, av.open(f, "w", format=fmt) as out:
            video_in = opened[0].streams.video[0]
            if video_in.codec_context.name not in out.supported_codecs:
                raise VideoError(
                    f"a {dst.suffix} file cannot hold {video_in.codec_context.name}: choose another --codec"
                )
            sources = [_chunk_packets(opened, frames_per_chunk, rate, out.add_stream_from_template(video_in))]
            for audio in source.streams.audio:
                name = audio.codec_context.name
                if name in out.supported_codecs:
                    sources.append(_demuxed(source, audio, out.add_stream_from_template(audio)))
                    notes.append(f"copied {name}")
                else:
                    codec = "libopus" if fmt == "webm" else "aac"
                    target = out.add_stream(
                        codec, rate=48000 if codec == "libopus" else audio.codec_context.sample_rate
                    )
                    sources.append(_reencoded(src, audio.index, target))
                    notes.append(f"re-encoded {name} -> {codec}")
            for _, packet in heapq.merge(*sources, key=lambda item: item[0]):
                out.mux(packet)
    finally:
        for chunk in opened:
            chunk.close()
    return notes


def upscale_video(
    engine,
    src: str | Path,
    dst: str | Path,
    outscale: float | None = None,
    codec: str = "libx264",
    crf: int = 18,
    chunk_seconds: float = 4.0,
    settings: dict | None = None,
    progress: bool = False,
    max_pixels: int | None = None,
) -> VideoReadout:
    """Upscale ``src`` into ``dst`` with ``engine`` (see the module's notes); resumable with the same arguments.

    ``settings``: what else decides the output's pixels (model, options), recorded with the chunks so that a
    changed setting starts the chunks afresh instead of mixing two models in one video.
    """
    from tqdm import tqdm

    src, dst = Path(src), Path(dst)
    av = _av()
    if codec not in CODECS:
        raise VideoError(f"unknown codec {codec!r}; choose from {', '.join(CODECS)}")
    if codec not in av.codecs_available:
        raise VideoError(f"codec {codec} is not in this PyAV build; choose from {', '.join(available_codecs())}")
    if dst.suffix.lower() not in FORMATS:
        raise VideoError(f"{dst}: the output must end in one of {', '.join(FORMATS)}")
    if real_path(dst) == real_path(src):
        raise VideoError(f"output {dst} would overwrite the input")
    with av.open(io.BytesIO(), "w", format=FORMATS[dst.suffix.lower()]) as scratch:
        if codec not in scratch.supported_codecs:
            raise VideoError(f"a {dst.suffix} file cannot hold {codec}: choose another --codec or output type")
    info = probe(src)
    if max_pixels and info.width * info.height > max_pixels:
        raise VideoError(f"{src} has {info.width}x{info.height} frames, over the limit of {max_pixels:,} pixels")
    from ..upscale.engine import output_size

    out_w, out_h = output_size(info.width, info.height, engine.scale, outscale)
    if CODECS[codec][0] == "yuv420p" and (out_w % 2 or out_h % 2):
        raise VideoError(f"{codec} needs an even width and height, and {out_w}x{out_h} is not: change --outscale")
    frames_per_chunk = max(1, round(float(info.rate) * chunk_seconds))
    parts = dst.with_name(f".{dst.name}.parts")
    state = _chunk_settings(src, settings or {}, codec, crf, frames_per_chunk)
    state_path = parts / "job.json"
    if parts.is_dir() and (not state_path.is_file() or json.loads(state_path.read_text()) != state):
        shutil.rmtree(parts)  # chunks of another input, model or setting: not to be mixed into this video
    parts.mkdir(parents=True, exist_ok=True)
    write_atomic(state_path, (json.dumps(state, indent=1) + "\n").encode())

    chunks: list[Path] = []  # every chunk of the video so far, made now or reused
    reused = frames = 0
    encoder: _ChunkEncoder | None = None
    start = time.perf_counter()
    bar = tqdm(total=info.frames or None, desc="frames", unit="frame", disable=not progress)
    try:
        for pixels in frames_of(src):
            if frames % frames_per_chunk == 0:  # a chunk begins: made by an earlier run, or to be made now
                chunks.append(parts / f"chunk_{len(chunks):06d}.mp4")
                if chunks[-1].is_file():
                    reused += 1
                else:
                    encoder = _ChunkEncoder(chunks[-1], codec, crf, info.rate, out_h, out_w)
            frames += 1
            if encoder is not None:
                encoder.add(engine.upscale(pixels, outscale)[0])
                if frames % frames_per_chunk == 0:
                    encoder.close()
                    encoder = None
            bar.update()
        if encoder is not None:
            encoder.close()
            encoder = None
    finally:
        bar.close()
        if encoder is not None:
            encoder.abandon()
    compute_s = time.perf_counter() - start
    if not frames:
        raise VideoError(f"{src} has no frames to upscale")
    audio = _join(chunks, frames_per_chunk, info.rate, src, dst)
    shutil.rmtree(parts, ignore_errors=True)
    return VideoReadout(
        frames=frames,
        chunks=len(chunks),
        chunks_reused=reused,
        compute_s=compute_s,
        input_size=(info.width, info.height),
        output_size=(out_w, out_h),
        rate=str(info.rate),
        audio=audio,
    )


def available_codecs() -> list[str]:
    """The codecs of :data:`CODECS` this PyAV build can encode with."""
    av = _av()
    return [c for c in CODECS if c in av.codecs_available]
