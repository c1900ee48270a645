"""The load generator: replays simulator workloads against a running OpenAI-compatible server."""
