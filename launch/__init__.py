"""Launch scripts (run them as files: `python launch/train.py ...`)."""
