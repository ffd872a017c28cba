"""BasicSR testing with our archs: ``python -m nala_gen.sr.test -opt options/test/NaLaSR/X.yml``.

Registers NaLaSR and ESRT, then runs BasicSR's own ``test_pipeline`` with the current directory as root
(``results/<name>/`` gets the images and the metric log).
"""

from __future__ import annotations

import os
import sys

import nala_gen.sr.basicsr  # noqa: F401  (registers the archs and the model in BasicSR's registries)


def main() -> None:
    import basicsr.test as basicsr_test  # after nala_gen.sr, which import sorting cannot keep

    basicsr_test.test_pipeline(os.getcwd())


if __name__ == "__main__":
    sys.exit(main())
