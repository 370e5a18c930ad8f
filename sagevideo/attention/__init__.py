"""The attention call users make: `scaled_dot_product_attention` (SDPA's signature) and `sageattn`
(`functional`), and the records of which backend computed each call (`records`)."""
