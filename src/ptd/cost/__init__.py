"""The analytic cost model: FLOPs, memory, communication and step time. Pure Python, no torch."""
