"""Models: loading them (torchvision names, `package.module:attribute`, model files),
their weights, and the device they run on.
"""
