"""RL systems (Chapter 13): Chapter 11's GRPO dataflow as worker roles, run by a single controller
on Ray (``ray_controller``), by multiple controllers as SPMD ranks under ``torchrun`` (``spmd``),
or in one process (``roles.LocalHost``), the reference the other two are tested against.

Needs the ``distributed`` extra (``pip install -e ".[distributed]"``) for Ray.
"""

from rlkit.systems.dataflow import PHASES, AsyncGRPODataflow, GRPODataflow, roles_needed
from rlkit.systems.roles import (
    ROLES,
    ActorRole,
    Generated,
    LocalHost,
    ReferenceRole,
    RewardRole,
    RolloutRole,
)

__all__ = [
    "PHASES",
    "ROLES",
    "ActorRole",
    "AsyncGRPODataflow",
    "GRPODataflow",
    "Generated",
    "LocalHost",
    "ReferenceRole",
    "RewardRole",
    "RolloutRole",
    "roles_needed",
]
