"""Inputs: what one sample of a model looks like, and the batches fed to it (seeded
random input, images, tensor files).
"""
