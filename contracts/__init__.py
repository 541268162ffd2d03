"""EVM contracts that anchor the ledger: their Vyper source, the build, and the compiled artifacts."""
