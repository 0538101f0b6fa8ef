"""prefixfleet: prefix-cache-aware serving layer for LLM fleets on Kubernetes."""

__version__ = "0.1.0"
