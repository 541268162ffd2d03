"""The node client: ``intellect-node``. Joins a coordinator and does the work it assigns."""
