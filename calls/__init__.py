"""The provider layer (architecture.md §2, §5): compiling a request, the adapters and the stream
reader, the progress bounds, classifying failures, making one call on the process loop and
recording it with its timeline. Below ``waits``: it knows nothing of holds, turns or the breaker."""
