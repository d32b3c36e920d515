"""The read wing: a dump's manifest and shards read back, checked, in bounded memory."""
