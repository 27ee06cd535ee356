"""Inference: text in, text out with a model or an engine (PyTorch, int8, CTranslate2), the
search settings, sacrebleu scoring and attention heatmaps.
"""
