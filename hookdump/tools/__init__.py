"""Tools over models and dumps: listing layers, inspecting, comparing and drawing dumps."""
