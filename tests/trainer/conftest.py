"""Fixtures of the trainer tests; they live in `trainer_processes` so tests can import its types."""

from trainer_processes import job, trainer

__all__ = ["job", "trainer"]
