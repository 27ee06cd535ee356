"""Importers: a pretrained model of another toolkit read into a `tf` run (Hugging Face Marian,
OPUS-MT's format)."""
