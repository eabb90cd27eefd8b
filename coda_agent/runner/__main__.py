"""``python -m coda_agent.runner``: the candidate runner, as the checker starts it inside the sandbox."""

import sys

from .serve import main

sys.exit(main())
