"""What runs in a card: the ``Card`` (its parts' command tables, dispatch, extension seam), its memory, stream
queues, peers, models."""
