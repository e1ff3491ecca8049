"""A reference recorded where PyTorch runs, checked where the runtime runs.

``bisect-onnx MODEL ... --record REF`` (:func:`~bisect_onnx.reference.recording.record`)
writes PyTorch's values at every ONNX value the comparison aligned into an archive
(:mod:`bisect_onnx.reference.archive`, described by its manifest,
:mod:`bisect_onnx.reference.manifest`); ``bisect-onnx check REF``
(:mod:`bisect_onnx.pipeline.check_reference`) runs only the runtime and compares it
with them (:class:`~bisect_onnx.reference.loaded.Reference`). docs/reference-format.md
describes the format.
"""
