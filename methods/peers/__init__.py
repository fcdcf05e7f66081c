"""The other training-free fixes for fragments prefilled alone, read on the same memory as MemDefrag."""
