"""Search over parallel plans with the cost model."""
