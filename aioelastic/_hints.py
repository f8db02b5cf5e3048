"""What to tell a user in the rendezvous errors and log lines that need a next step.

A root module: the agent and the torchrun plugin, both above ``rendezvous``, print these.
"""

from __future__ import annotations

__all__ = ["CLOSED_RUN", "STANDBY"]

#: after "the rendezvous 'X' is closed" met by a node that never joined a round of that run
CLOSED_RUN = (
    "a run id is closed when its job ends (succeeded or out of restarts): start the new job with "
    "a new --rdzv-id, or add --rdzv-conf reopen_closed=1 to open a new generation of this one"
)

#: why a node waits with no round to join
STANDBY = (
    "the job is full (max nodes reached, every member alive): standing by for the next round, "
    "which forms when a member is lost or the job restarts; no join timeout applies meanwhile"
)
