"""The Open Inference Protocol v2 (REST), in one room: ``codec`` turns the protocol's tensors into inferq's inputs
and its results back into the protocol's outputs (pure, no I/O); ``routes`` serves /v2 over inferq's jobs."""
