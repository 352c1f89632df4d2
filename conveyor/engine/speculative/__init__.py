"""Speculative decoding: proposers of draft tokens (ngram.py) and their verification in the engine's
step (verify.py)."""
