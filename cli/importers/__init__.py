"""Importers: a pretrained model of another toolkit read into a `tf` run (Hugging Face Marian,
NLLB-200, M2M100 and mBART-50), one module per family over what they share."""
