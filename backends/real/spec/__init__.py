"""Speculative decoding beside the model runner: draft proposers and draft verification."""
