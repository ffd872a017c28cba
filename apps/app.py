"""The NaLa web app, as a Gradio Space (or ``python apps/app.py``) runs it: a launcher of ``nala-app``.

The app's code lives in the library (:mod:`nala_gen.app`); this file only starts it, with ``nala-app``'s options.
"""

import sys

from nala_gen.app.ui import main

if __name__ == "__main__":
    sys.exit(main())
