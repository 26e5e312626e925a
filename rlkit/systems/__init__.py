"""RL systems (Chapter 13): Chapter 11's GRPO dataflow as worker roles, run by a single controller
on Ray (``ray_controller``), by multiple controllers as SPMD ranks under ``torchrun`` (``spmd``),
or in one process (``roles.LocalHost``), the reference the other two are tested against.

Needs the ``distributed`` extra (``pip install -e ".[distributed]"``) for Ray.
"""

from rlkit.systems.dataflow import PHASES, GRPODataflow
from rlkit.systems.roles import ROLES, ActorRole, Generated, LocalHost, ReferenceRole, RewardRole

__all__ = [
    "PHASES",
    "ROLES",
    "ActorRole",
    "GRPODataflow",
    "Generated",
    "LocalHost",
    "ReferenceRole",
    "RewardRole",
]
