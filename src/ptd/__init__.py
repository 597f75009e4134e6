"""ptd: plan, run and measure 3D-parallel (pipeline x tensor x data) training of transformers.

* :mod:`ptd.specs`   -- model, hardware and plan (no torch)
* :mod:`ptd.cost`    -- the analytic cost model (no torch)
* :mod:`ptd.planner` -- search over plans with the cost model
* :mod:`ptd.runtime` -- the real thing on torch.distributed
* :mod:`ptd.cli`     -- ``ptd calc | estimate | plan | train | bench | calibrate | report``
"""

__version__ = "0.1.0"
