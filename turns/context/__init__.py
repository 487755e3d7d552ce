"""Long-running agents and the model's window (architecture.md §5.9): estimate a request's size
before it goes, and when it will not fit (or a provider refused it as too long) set aside the
oldest presented rows, or summarize them, per the agent's ``context_policy``."""
