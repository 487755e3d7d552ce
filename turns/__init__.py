"""The turn orchestration (architecture.md §2, §5.1, §5.7): the drain that runs an agent's turns
under its lease, the turn services that own every ``Turn`` transition, holds, retries and re-arms,
notes, and what follows a failure (the breaker's streak, probe, shed and retry). Above
``breaker``, ``waits`` and ``calls``."""
