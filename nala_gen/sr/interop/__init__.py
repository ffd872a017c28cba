"""NaLaSR and ESRT in other runtimes: :mod:`.spandrel_support` (spandrel's model loader, as chaiNNer and ComfyUI
use it) and :mod:`.onnx_export` (``nala-sr export-onnx``, checked against onnxruntime)."""
