"""Training-free speculative Jacobi decoders, no drafter: SJD, coupled SJD, SJD-PAC's continuation and
proactive drafting, lossless 2-D drafting, relaxed 2-D rows, LANTERN- or GSD-relaxed acceptance.

* `config`: `JacobiConfig` (window, init, rule, 2-D geometry) and the geometries an `auto` run tries;
* `shape`: what fixes an iteration's shapes (`JacobiShape`), its attention windows and the queries' layout;
* `state`: the preallocated device state of a batch (`JacobiState`) and the target's law per position;
* `rows`: the lanes and masks of the lower-row windows (2-D drafting);
* `proactive`: proactive candidates (leaves) and their recursive rejection sampling;
* `judge`: the acceptance test of a window's leading run;
* `iteration`: one static-shape iteration (refill, forward, judge, emit), replayed from a CUDA graph on CUDA;
* `batch`: the loop over iterations for a batch of images; `auto`: the `auto` window and geometry;
  `driver`: `jacobi_generate`.

May import the shared ground of `decoding/` (and `acceptance/`), `models/`, and the library's top-level
modules; never `trees/` or the modules over both families (`modes`, `report`, `reservation`).
"""
from .config import INITS, JacobiConfig
from .driver import jacobi_generate

__all__ = ["INITS", "JacobiConfig", "jacobi_generate"]
