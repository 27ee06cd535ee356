"""The run store: the run directory, the checkpoint format, what a model directory is, a
model built and given its weights for any reader, and a LoRA run's base.pt. Below every
other room: it imports only the shared modules, data/ and model/.
"""
