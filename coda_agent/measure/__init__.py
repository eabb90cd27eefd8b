"""Measurement: the timing protocol, the baselines a kernel is timed against, measured peaks, speed of light.

Below the verifier and the bench (both use it); it knows tasks but nothing of candidates or verdicts.
"""
