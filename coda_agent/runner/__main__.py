"""``python -m coda_agent.runner``: the candidate runner, as the checker starts it inside the sandbox."""

from .serve import main

main()
