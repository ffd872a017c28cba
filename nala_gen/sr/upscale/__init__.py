"""The upscaling engine behind ``nala-sr upscale``, ``nala-sr evaluate``, BasicSR validation and the app.

* :mod:`.engine`: :class:`~nala_gen.sr.upscale.engine.Upscaler` (tiles, memory budget, precision, streaming rows);
* :mod:`.probe_cache`: the auto-tile memory probes, kept across processes;
* :mod:`.resample`: row-streamed resizing (``--outscale``); :mod:`.imageio`: reading and atomic writing of images.
"""
