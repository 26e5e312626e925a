"""RL systems (Chapter 13): Chapter 11's GRPO and Chapter 10's RLHF-PPO dataflows as worker roles,
run by a single controller on Ray (``ray_controller``), by multiple controllers as SPMD ranks under
``torchrun`` (``spmd``), or in one process (``roles.LocalHost``), the reference the other two are
tested against.

Needs the ``distributed`` extra (``pip install -e ".[distributed]"``) for Ray.
"""

from rlkit.systems.dataflow import (
    PHASES,
    PPO_PHASES,
    AsyncGRPODataflow,
    Dataflow,
    GRPODataflow,
    PPODataflow,
    dataflow_for,
    roles_needed,
)
from rlkit.systems.roles import (
    PPO_ROLES,
    ROLES,
    ActorRole,
    CriticRole,
    Generated,
    LocalHost,
    PPOActorRole,
    PPORewardRole,
    ReferenceRole,
    RewardRole,
    RolloutRole,
)

__all__ = [
    "PHASES",
    "PPO_PHASES",
    "PPO_ROLES",
    "ROLES",
    "ActorRole",
    "AsyncGRPODataflow",
    "CriticRole",
    "Dataflow",
    "GRPODataflow",
    "Generated",
    "LocalHost",
    "PPOActorRole",
    "PPODataflow",
    "PPORewardRole",
    "ReferenceRole",
    "RewardRole",
    "RolloutRole",
    "dataflow_for",
    "roles_needed",
]
