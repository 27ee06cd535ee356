"""Model families: one record per family of pretrained models `tf import` reads and `tf export
--to huggingface` writes (Marian/OPUS-MT, NLLB-200 and M2M100, mBART-50), registered once
(`registry`), over the generic machinery of the importers and exporters."""
