"""ONNX's reference evaluator (``onnx.reference``), a reference only: not in the registry.

ONNX against ONNX runs the reference model in it when asked
(``--against-reference-evaluator``); it never runs the model under test.
"""
