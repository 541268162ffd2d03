"""Code that two or more roles need: wire schemas, identity, request signing."""
