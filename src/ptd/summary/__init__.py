"""What a run measured beside what the cost model predicted, torch-free: the schema of
``summary.json``, the comparison table, the routing summary; read by the runtime and by
reports."""
