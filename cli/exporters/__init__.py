"""Exporters: a trained run written out for other engines: CTranslate2, and what every Hugging
Face export shares (its settings, its tokenizer's files, its model card); each family's class
is its record's (`cli.families`)."""
