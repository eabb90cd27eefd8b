"""Prompt material: the primitive API reference (generated from docstrings) and the message templates."""
