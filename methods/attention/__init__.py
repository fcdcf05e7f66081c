"""Reading a decoder from the inside: its layers and attention modules, rotary positions, attention rows."""
