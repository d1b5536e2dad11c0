"""HCCL inside a card: the extension the card loads (its command tables, per-card state), the endpoints, and
the collective and send/recv tasks that run on them."""
