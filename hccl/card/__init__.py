"""HCCL inside a card: the extension the card loads (commands, per-card state) and the endpoints."""
