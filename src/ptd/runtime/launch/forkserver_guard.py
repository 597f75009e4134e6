"""Imported first in ``ptd train``'s fork server (``multiprocessing.set_forkserver_preload``):
the server asks the kernel for SIGKILL when ``ptd train`` dies (``ptd.children``).

Why: killed outright (SIGKILL, the OOM killer), ``ptd train`` runs no code, and torchrun's
agent with it; the fork server and the workers it forked were left running and went on
training into the run folder to the last step (seen with ``kill -9`` on a 2-worker run:
both workers at full CPU after their agent was gone). With this the server dies with
``ptd train``, and each worker, which asks the same of the server when it starts
(``PTD_WORKER_DIES_WITH_PARENT``, set by the launcher), dies with the server. Only the
fork server imports this module.
"""

from ...children import die_with_parent

die_with_parent()
