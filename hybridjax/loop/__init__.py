"""The host loop: drivers for each mode (`drivers`) and `train` (`train`)."""
