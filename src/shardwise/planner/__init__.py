"""The planner: memory and step-time models, the layout search, and the explanation (pure Python, no torch)."""

from shardwise.planner.estimate import Estimate, estimate
from shardwise.planner.job import Job

__all__ = ["Estimate", "Job", "estimate"]
