"""Settings every test shares."""

import os

# The auto-tile probe cache (nala_gen.sr.upscale.probe_cache) is off for the test run: a reading taken late in a long
# test session (its allocator holding freed memory) must not plan another test's fresh process, nor may tests write to
# the user's ~/.cache. tests/test_probe_cache.py turns it on, with files of its own. Subprocesses inherit this.
os.environ["NALA_GEN_PROBE_CACHE"] = "off"
