"""Which PyTorch value (or reference ONNX value) stands for which ONNX value."""
