"""Workflows composed from the other rooms: `ab` (quantized vs full precision, evaluated),
`calibrate` (a per-layer attention plan from real prompts), `probe` (per-layer attention error
during a real run)."""
