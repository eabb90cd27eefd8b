"""The agent: prompts an LLM with the primitive API and a task, verifies each reply, feeds the results back.

``Agent.create(task, provider, config, runs_dir)`` starts a run, ``Agent.resume(run_dir, provider)``
continues one; ``await agent.run()`` returns the final :class:`~coda_agent.store.records.RunSummary`.
"""

from .extract import Extraction, extract_code
from .loop import Agent, AgentConfig, FatalProviderError, RunEvents, SharedBudget, gpu_verifier_available

__all__ = [
    "Agent", "AgentConfig", "Extraction", "FatalProviderError", "RunEvents", "SharedBudget", "extract_code",
    "gpu_verifier_available",
]
