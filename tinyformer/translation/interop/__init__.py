"""Models from and for other frameworks: Hugging Face Marian folders, PyTorch nn.Transformer state dicts."""
