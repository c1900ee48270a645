"""twinserve: an LLM serving engine and its discrete-event digital twin."""

__version__ = "0.1.0"
