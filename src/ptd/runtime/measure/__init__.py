"""Measurement of every run, held against the cost model's prediction.

* :mod:`.probe` -- attaches to the trainer: phase spans and timers, the profiled window,
  the memory step; gathers every rank's results at the end;
* :mod:`.timeline` -- profiler events of one step -> breakdown (pure Python);
* :mod:`.memory` -- model states from the tensors, activation peak by a dispatch mode;
* :mod:`.compare` -- the prediction for the same run, ratios, the printed table.
"""
