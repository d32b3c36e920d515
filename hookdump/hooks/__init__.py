"""Hooks: selecting modules, capturing what they take and return (and their gradients),
and running a forward pass under them.
"""
