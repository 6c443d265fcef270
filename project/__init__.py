"""A PyTorch Lightning template for distributed training: the same code on one CPU, many GPUs and many nodes."""
