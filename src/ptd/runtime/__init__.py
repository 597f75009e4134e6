"""The real thing: the model, the parallel dimensions, the trainer, on torch.distributed."""
