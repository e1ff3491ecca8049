"""Formats of a :class:`~bisect_onnx.records.Report`: text table and verdict, JSON."""
