"""Workflows composed from the other rooms: `ab` (quantized vs full precision, evaluated),
`calibrate` (a per-layer attention plan from real prompts), `probe` (per-layer attention error
during a real run), `profile` (one step's time split), `bench` (the benchmark library behind
`sagevideo bench`: attention calls and whole forwards side by side, and the results file)."""
