"""Facts read from an ONNX graph: module scopes, provenance metadata, external weights."""
