"""Exporters: a trained run written out for other engines (CTranslate2, Hugging Face Marian)."""
