"""Applications built on the ``nala_gen`` library (they import it; it never imports them).

``apps.nala_app`` is the Gradio web app (``nala-app``): upscale, generate, and attention scaling.
"""
