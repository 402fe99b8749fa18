"""Hardware profiles for `launch/simulate_cluster.py` (ml_collections, `get_config()`)."""
