"""Values, keys, update ops, results, the clock: what every layer uses."""
