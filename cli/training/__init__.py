"""Training: the trainer loop, the run directory, checkpoints, the optimiser and its schedules,
the weight average, the training data and its batches, and torch.distributed.
"""
