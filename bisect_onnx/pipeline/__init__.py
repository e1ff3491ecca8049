"""The drivers that wire the stages together: PyTorch against ONNX, ONNX against ONNX, parity."""
