"""cleaner: agentic RL for tool-using language models with CLEANER's self-purified trajectories."""

__version__ = "0.1.0"
