"""Training: the update loop and the state its parts save (weights, LoRA, EMA, shards),
validation, stop rules, starting and resuming a run, `train.init`'s settings, the optimiser,
the training data, and torch.distributed.
"""
