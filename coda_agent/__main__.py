"""``python -m coda_agent`` runs the CLI (used on machines where the package is on PYTHONPATH, not
installed)."""

from .launch import main

main()
