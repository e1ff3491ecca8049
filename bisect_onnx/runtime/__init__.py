"""ONNX Runtime: sessions, which values to promote, the captured side, the memory budget."""
