"""Code that two or more roles need: wire schemas, identity, request signing.

Importing this package pins the interpreter's recursion limit (:mod:`shared.interpreter`)."""

from intellect_protocol.shared.interpreter import pin_recursion_limit

pin_recursion_limit()
