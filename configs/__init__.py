"""Shipped configurations (ml_collections). Each file's docstring starts with its command."""
