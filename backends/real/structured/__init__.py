"""Structured output on the real engine: grammar compilation (front end) and logit masks (model runner)."""
