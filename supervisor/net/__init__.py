"""The network a turn reaches: the daemon's proxy (:mod:`.proxy`) and what it parses (:mod:`.wire`)."""
