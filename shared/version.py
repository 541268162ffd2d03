"""The distribution's version, as nodes report it and the coordinator checks it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("intellect-protocol")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
