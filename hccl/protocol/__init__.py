"""The shared-memory protocol of a node: control block, staged small collectives, futex waits."""
