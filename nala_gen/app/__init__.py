"""The Gradio web app behind ``nala-app``: upscale, generate, and attention scaling.

``engine`` turns widget values into library calls, ``scaling`` reads and plots the attention benchmarks, ``ui``
lays out the page and holds the ``nala-app`` entry point. The repository's ``apps/app.py`` is a thin launcher of
:func:`nala_gen.app.ui.main` (the file a Gradio Space runs).
"""
