"""Formats of a :class:`~bisect_onnx.judge.records.Report`: text table and verdict, JSON."""
