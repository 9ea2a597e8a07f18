"""What crosses the wire (internal): the rendezvous channel and its authenticated gate, the feed's
frames, shared-memory rings, the feeding tasks' side and the node's :class:`DataFeed`."""
