"""What runs in the rank's own process: the ``rt`` API, handles, copies, the runtime state, tensors."""
