"""The local devnet: every role as its own process on loopback (``intellect-devnet``)."""
