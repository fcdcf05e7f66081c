"""MemoryLLM and M+: their checkpoints, their slot memory, and the two as methods."""
