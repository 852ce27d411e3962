"""How a drafted token is judged against the target, for every speculative decoder:

* `siblings`: exact rejection sampling among a node's sampled or top-k children (recursive, with the
  drafter's conditionals), and the carving of absorbed neighbours on rejection;
* `relaxation`: LANTERN's relaxed law (a TVD budget delta, or LANTERN++'s bound lambda) and GSD's grouping;
* `neighbors`: the latent-neighbour tables those rules read (built from the VQ codebook, cached on disk);
* `position_noise`: the noise keyed by (seed, image, position) AR and the AR-identical rule race with;
* `seed_identity`: which decoders give AR's image for a seed (the stats' claim, what `auto` may vary).

May import the shared ground of `decoding/` and the library's top-level modules; never a decoder family.
"""
