"""What crosses processes and nodes: rendezvous (local, Ray) and a communicator's cross-node rounds and step data over direct links."""
