"""The PyTorch reference side: the model's forms run with every value recorded, and the export."""
