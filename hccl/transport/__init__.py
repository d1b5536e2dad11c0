"""What crosses processes and nodes: rendezvous and the cross-node hub (local, Ray)."""
