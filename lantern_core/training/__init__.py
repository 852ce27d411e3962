"""Training the embedded default model and EAGLE drafters (deterministic, CPU-friendly). Not imported by the
decoders or the nodes."""
