"""The Ray shell: the card actor, the embedded session and joining a cluster, the ``rt.init`` backend."""
