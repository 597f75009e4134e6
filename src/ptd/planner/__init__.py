"""Search over parallel plans with the cost model (no torch).

* :mod:`.search`  -- :func:`.search.search`: enumerate, prune with reasons, price with :mod:`ptd.cost`, rank;
* :mod:`.pareto`  -- the memory-versus-step-time Pareto front;
* :mod:`.explain` -- what each alternative value of the winner's dimensions would cost;
* :mod:`.export`  -- the winner for ptd, torchtitan, Megatron-LM and DeepSpeed.
"""

from .search import OBJECTIVES, SearchResult, parse_fix, ranked_plans

__all__ = ["OBJECTIVES", "SearchResult", "parse_fix", "ranked_plans"]
