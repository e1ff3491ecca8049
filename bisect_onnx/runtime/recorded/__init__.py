"""A reference recorded elsewhere (PyTorch's values in an archive), a reference only.

Not in the registry: ``bisect-onnx check`` runs a recorded reference against the
runtime under test, and a recorded reference never runs a model itself.
"""
