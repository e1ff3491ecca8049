"""The ``bisect-onnx`` command."""
