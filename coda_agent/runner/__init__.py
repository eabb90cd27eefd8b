"""What runs inside the sandbox, beside the candidate: the trust boundary is this package's edge.

The checker (:mod:`coda_agent.verifier`) starts ``python -m coda_agent.runner`` in bubblewrap and talks to it
over :mod:`.protocol`; everything the runner says is data to the checker. This package imports only the
primitives the candidate calls, the timing clock (:mod:`coda_agent.measure.timing`), torch and the standard
library: never a task, a reference, a tolerance, a stage, a verdict or the store (``tests/test_layering.py``
holds it to that list, in a fresh interpreter). :mod:`.protocol` is the one module both sides import.

- :mod:`.serve`: the runner's loop (load the candidate, run the calls it is told, send back what came out);
- :mod:`.candidate`: the candidate module, imported from a real file;
- :mod:`.protocol`: the wire (typed requests and replies as JSON lines, raw tensor files; validated on read).
"""
