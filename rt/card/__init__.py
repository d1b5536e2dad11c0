"""What runs in a card: the ``Card`` (dispatch, extension seam), its memory, stream queues, peers, models."""
