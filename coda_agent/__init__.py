"""coda-agent: an LLM-driven GPU-kernel authoring agent for CODA-style fused GEMM epilogues."""

__version__ = "0.1.0"


def version_line() -> str:
    """What ``coda-agent --version`` prints (the console script answers it before loading the CLI)."""
    return f"coda-agent {__version__}"
