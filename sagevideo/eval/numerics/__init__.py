"""Attention numerics: error metrics against exact attention (`errors`), stress inputs
(`presets`) and the quantization simulator (`simulate`)."""
