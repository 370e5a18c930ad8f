"""Attention numerics: stress inputs (`presets`) and the quantization simulator (`simulate`); the
error metrics against exact attention live with attention (`sagevideo.attention.accuracy`), where
calibration reads them too."""
