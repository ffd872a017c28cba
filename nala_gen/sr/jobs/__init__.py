"""Batch jobs: folders of images (:mod:`.folder`: resumable, sharded, streamed) and videos (:mod:`.video`), each
recorded in a JSON-lines manifest (:mod:`.manifest`) beside the outputs.

The manifest's names are re-exported here (``from nala_gen.sr.jobs import JobManifest``), as before the layout.
"""

from nala_gen.fileio import file_sha256

from .manifest import MANIFEST_NAME, JobManifest

__all__ = ["MANIFEST_NAME", "JobManifest", "file_sha256"]
