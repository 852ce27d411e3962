"""Every decoder in one place: plain AR (`generate`, over the static-shape steps of `ar_step`), EAGLE drafter
trees (`speculative`, `drafting`, `tree*`), Jacobi windows (`jacobi`, `jacobi_window`), and what they share:
sampling, acceptance rules, LANTERN relaxation and the latent-neighbour tables. Loading, training and
benchmarks live in sibling packages; models (attention, KV cache) in `models/`.
"""
