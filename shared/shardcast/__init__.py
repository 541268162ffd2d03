"""Shardcast: policy weights from the trainer to every node, through relays nobody has to trust.

- :mod:`.manifest`: what a step is (files, chunks, blake3 hashes), signed by the trainer; :mod:`.chunking`: its chunk size and digests.
- :mod:`.store`: a directory of steps on disk and which chunks of them are verified.
- :mod:`.server`: the HTTP server of an origin or a relay (Range reads, chunk maps).
- :mod:`.relay`: a relay's loop: learn steps from the coordinator, fetch, verify, serve.
- :mod:`.client`: download a step from several relays at once, verified, resumable.

The coordinator is the trust anchor: manifests come from it, never from a relay, and it
only accepts them from addresses holding the trainer role.
"""
