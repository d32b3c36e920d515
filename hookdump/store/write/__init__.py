"""The write wing: a run's rows into shard files, committed and listed in the manifest."""
