"""bench: find the fastest PyTorch training configuration that fits a GPU, by measuring."""
__version__ = "0.1.0"
