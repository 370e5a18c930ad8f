"""The attention call users make: `scaled_dot_product_attention` (SDPA's signature) and `sageattn`
(`functional`), the registry of backends that can compute it and why not (`backends`), and the
records of which backend computed each call (`records`). Triton is never imported here."""
