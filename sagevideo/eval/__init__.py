"""Evaluation: attention-error metrics, synthetic inputs, the quantization-error simulator."""
