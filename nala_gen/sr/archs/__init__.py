"""The super-resolution networks, one ``*_arch.py`` each, as BasicSR lays out ``basicsr/archs``.

* :mod:`.nalasr_arch`: NaLaSR, ESRT's layout with the paper's NaLa block as its attention (torch only);
* :mod:`.esrt_arch`: ESRT as published (torch only);
* :mod:`.srvgg_zero_init_arch`: BasicSR's SRVGGNetCompact with a trainable-from-scratch init (imports BasicSR);
* :mod:`.fast`: the fast inference form that an ESRT-layout network builds and its own ``forward`` runs in inference
  (:mod:`.esrt_layers`: the small layers both share).

The BasicSR settings of the networks NaLaSR is compared with are the benchmarks' (:mod:`nala_gen.bench.peers`).

None is registered at import: ``import nala_gen.sr.basicsr`` puts them in BasicSR's ``ARCH_REGISTRY``, so the
upscaler, spandrel and ONNX paths never import BasicSR.
"""
