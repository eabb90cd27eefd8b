"""coda-agent: an LLM-driven GPU-kernel authoring agent for CODA-style fused GEMM epilogues."""

__version__ = "0.1.0"
