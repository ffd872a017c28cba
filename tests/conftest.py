"""Settings every test shares."""

import os

# The auto-tile probe cache (nala_gen.sr.upscale.probe_cache) is off for the test run: a reading taken late in a long
# test session (its allocator holding freed memory) must not plan another test's fresh process, nor may tests write to
# the user's ~/.cache. tests/test_probe_cache.py turns it on, with files of its own. Subprocesses inherit this.
os.environ["NALA_GEN_PROBE_CACHE"] = "off"
# The fast SR form's per-machine choice of convolution kernels (nala_gen.sr.archs.fast.conv_choice) is static here:
# an output must depend on the options alone, never on a timing, and no test may write to ~/.cache. Tests of the
# choice turn probing on with ``using(conv_choice="probe")`` and a cache file of their own.
os.environ["NALA_GEN_CONV_CHOICE"] = "static"
