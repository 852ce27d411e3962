"""`make bench` / `make bench-cuda`: AR speed (`ar`), speculative decoders (`speculative`) and the prompted
families' shapes (`families`). Each writes JSON + markdown under bench/results; timings are never asserted."""
