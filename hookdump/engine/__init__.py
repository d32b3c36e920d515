"""A whole `hookdump run`: its options, the batch loop, resuming, and splitting the
samples over torchrun processes.
"""
