"""Dumps on disk: the output folder, the writer thread and shard files, the reader, and
per-key statistics.
"""
