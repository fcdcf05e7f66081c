"""Which stored fragments a question is answered with: a ranker, a size rule, an arrangement and a reading
(MemDefrag is one combination: attention density, Top-K, densest last, read as latent memory)."""
