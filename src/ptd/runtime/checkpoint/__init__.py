"""Distributed checkpoints that reshard, exact resume, and their validation.

* :mod:`.store` -- the format on disk (manifest, marker, sizes and hashes), discovery,
  validation, pruning; no ``torch.distributed``;
* :mod:`.state` -- the state dict: model and optimizer by whole-model parameter names
  (``get_state_dict``/``set_state_dict``; ZeRO-1 through its local optimizer), RNG states,
  the NaN/inf check;
* :mod:`.saver` -- :class:`~.saver.Checkpointer`: every K steps, atomic, optionally async;
* :mod:`.restore` -- which checkpoint a run resumes from, and loading it.

See docs/checkpoints.md.
"""
