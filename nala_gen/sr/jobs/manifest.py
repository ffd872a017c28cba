"""Resumable batch upscaling: a JSON-lines manifest beside the outputs, one record per image.

Each finished image appends ``{"input", "output", "input_sha256", "settings", "status", ...timings}`` and syncs
it. Outputs are written atomically (a temporary file, then a rename), so an output that exists is complete; a
job killed at any moment and started again with ``--skip-existing`` skips every image whose output exists and
whose record (when there is one) names the same input bytes and settings, and so redoes at most the images that
were in flight. An image whose record names another model or other options is done again (and says so). A torn
last line, from a kill during the append, is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MANIFEST_NAME = "nala-sr-manifest.jsonl"


class JobManifest:
    """The records of one output folder's jobs, keyed by output path (the latest record of each wins)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: dict[str, dict] = {}
        if self.path.is_file():
            for line in self.path.read_text(errors="replace").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a kill during the append
                if isinstance(record, dict) and "output" in record:
                    self.records[record["output"]] = record

    def why_redo(self, dst: Path, input_sha256: str, settings: dict) -> str | None:
        """None when ``dst`` exists and no record contradicts it; otherwise why the image must be made again."""
        if not dst.exists():
            return "no output yet"
        record = self.records.get(str(dst))
        if record is None:
            return None  # an output made without a record (e.g. by a run killed before it wrote one) is complete
        if record.get("status") != "ok":
            return "its last run failed"
        if record.get("input_sha256") != input_sha256:
            return "the input changed"
        if record.get("settings") != settings:
            changed = sorted(
                k for k in {*settings, *record.get("settings", {})} if settings.get(k) != record["settings"].get(k)
            )
            return f"the settings changed ({', '.join(changed)})"
        return None

    def append(self, record: dict) -> None:
        """Add one record durably (appended, flushed and synced)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records[record["output"]] = record
