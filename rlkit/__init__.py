"""rlkit: the tested library behind the book. Importing it registers the ``rlkit/`` gymnasium
environments."""

from rlkit import envs  # noqa: F401  (registers rlkit/GridWorld-v0)
from rlkit.advantages import discounted_returns, gae
from rlkit.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    entropy,
    kl_estimate,
    masked_mean,
    masked_whiten,
    policy_gradient_loss,
)

__version__ = "0.1.0"
__all__ = [
    "discounted_returns",
    "gae",
    "masked_mean",
    "masked_whiten",
    "policy_gradient_loss",
    "clipped_policy_loss",
    "clipped_value_loss",
    "entropy",
    "kl_estimate",
]
