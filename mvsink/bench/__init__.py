"""Benchmarks: measured figures printed next to a baseline from the same run (ratios, not
absolute times, are what to compare on noisy machines)."""
