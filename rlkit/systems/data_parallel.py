"""Data parallelism for the trainers of Chapters 8 to 12 (Chapter 13): the same trainer on every
device, DDP or FSDP, launched by Hugging Face Accelerate.

On GPUs, with a config file of ``configs/accelerate/`` (``ddp.yaml`` or ``fsdp.yaml``)::

    accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 4 \\
        -m rlkit.systems.data_parallel grpo --config grpo.json --out runs/grpo-ddp

where ``grpo.json`` holds the fields of the algorithm's config (``GRPOConfig`` here; ``device`` is
set per rank). On the CPU, over gloo, as the tests run it::

    torchrun --nproc-per-node 2 -m rlkit.systems.data_parallel sft --config sft.json \\
        --out runs/sft-ddp --mode fsdp

Every rank builds the same trainer from the same config (the same start and held-out set), and
``make_data_parallel`` then changes three things. Each rank trains on its share of every batch
(``shard_data``): the config's batch sizes are per rank, as Accelerate's are per device. Every
rank after the first samples from a stream of its own. RLHF-PPO's whitening of the advantages and
its adaptive KL coefficient read every rank's numbers. And the ranks step together:

- ``"ddp"``: every rank starts from rank 0's weights and, at each optimizer step, replaces its
  gradient with the ranks' mean weighed by what each rank's loss is a mean over (its tokens,
  completions or pairs), the global batch's gradient (eq-data-parallel); PyTorch's DDP takes the
  plain mean, in buckets overlapped with the backward pass, where this follows the accumulation;
- ``"fsdp"``: each transformer block, and then the whole model, is sharded with FSDP2's
  ``fully_shard``: each rank keeps ``1/W`` of every weight, gradient and optimizer state, gathers a
  block's weights for its forward and backward passes, and reduce-scatters its gradients.

The trainer's model stays the Hugging Face model that its code calls (generation, LoRA's disabled
adapters), which a DDP wrapper would hide: that is why rlkit applies both itself instead of
through ``accelerator.prepare``. Accelerate starts the processes, picks the device and the backend
(NCCL on GPUs, gloo on the CPU), and its config file says which of the two it is (FSDP when
``distributed_type: FSDP``; Accelerate runs FSDP on accelerators only, hence ``--mode`` here).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from rlkit.checkpoint import write_atomically
from rlkit.llm.trainer import LanguageModelTrainer, adamw_with_decay_groups
from rlkit.systems.spmd import (
    AcrossRanks,
    GradientAverager,
    broadcast_parameters,
    rank_seed,
    run_torchrun,
)
from rlkit.training import fit, is_count, require

__all__ = [
    "ALGORITHMS",
    "MODES",
    "launch",
    "make_data_parallel",
    "require_data_parallel_run",
]

MODES = ("ddp", "fsdp")
ALGORITHMS = ("sft", "reward-model", "rlhf-ppo", "grpo", "dpo")  # Chapters 8 to 12 (rlkit's names)
SAMPLING = ("rlhf-ppo", "grpo")  # their training steps generate


def config_and_trainer(algorithm: str) -> tuple[type, type]:
    """The config and trainer classes of one of ``ALGORITHMS``."""
    from rlkit.llm import dpo, grpo, reward_model, rlhf_ppo, sft

    require(algorithm in ALGORITHMS, "algorithm", f"one of {ALGORITHMS}", algorithm)
    return {
        "sft": (sft.SFTConfig, sft.SFTTrainer),
        "reward-model": (reward_model.RewardModelConfig, reward_model.RewardModelTrainer),
        "rlhf-ppo": (rlhf_ppo.RLHFPPOConfig, rlhf_ppo.RLHFPPOTrainer),
        "grpo": (grpo.GRPOConfig, grpo.GRPOTrainer),
        "dpo": (dpo.DPOConfig, dpo.DPOTrainer),
    }[algorithm]


def require_data_parallel_run(algorithm: str, config, mode: str) -> None:
    """The runs whose ranks take their optimizer steps together: every rank must step as often as
    the others, or the collectives of the one ahead wait forever."""
    require(algorithm in ALGORITHMS, "algorithm", f"one of {ALGORITHMS}", algorithm)
    require(mode in MODES, "mode", f"one of {MODES}", mode)
    samples = algorithm in SAMPLING or getattr(config, "pairs", None) == "online"
    require(
        mode == "ddp" or not samples,
        "mode",
        "'ddp' for a trainer that samples while it trains (under FSDP every rank must run as many "
        "forward passes as the others, and each rank's sampling ends at a step of its own)",
        mode,
    )
    require(
        getattr(config, "pairs", None) != "online",
        "pairs",
        "'offline' under data parallelism (online, a rank whose pairs are all ties skips its "
        "step, and the others would wait for it)",
        getattr(config, "pairs", None),
    )
    require(
        getattr(config, "dynamic_sampling_rounds", 0) == 0,
        "dynamic_sampling_rounds",
        "0 under data parallelism (each rank would keep a number of groups of its own, and so "
        "take a number of steps of its own)",
        getattr(config, "dynamic_sampling_rounds", 0),
    )
    require(
        getattr(config, "scale", None) != "batch",
        "scale",
        "'group' or 'none' under data parallelism (the batch's std would be each rank's)",
        getattr(config, "scale", None),
    )


def make_data_parallel(trainer: LanguageModelTrainer, mode: str) -> None:
    """This rank's share of the data, its own sampling stream, and the ranks' joint steps
    (``mode``: ``"ddp"`` or ``"fsdp"``), in a process group already started."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    trainer.shard_data(rank, world_size)
    trainer.ranks = AcrossRanks()  # RLHF-PPO's whitening and KL controller read every rank's
    if rank > 0:
        torch.manual_seed(rank_seed(trainer.config.seed, rank))
    if mode == "ddp":
        for model, _ in trainer.stepped_models().values():
            broadcast_parameters(model)
        trainer.average_gradients = GradientAverager()
    else:
        shard_blocks(trainer.model)
        trainer.optimizer = adamw_with_decay_groups(
            trainer.model, trainer.config.learning_rate, trainer.config.weight_decay
        )


def shard_blocks(model: torch.nn.Module) -> None:
    """FSDP2 over ``model``: each transformer block (the classes its Hugging Face model names
    in ``_no_split_modules``) a unit of its own, then the rest (embeddings, head) as one; the
    LoRA adapters inside a block are sharded with it."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = set(getattr(base, "_no_split_modules", None) or ())
    require(
        bool(blocks),
        "model",
        "a Hugging Face model that names its transformer blocks (_no_split_modules)",
        type(base).__name__,
    )
    for module in list(base.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(base)  # with LoRA, the model its adapters wrap: every call goes through it


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 (every rank takes part: a sharded model is gathered)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def run(algorithm: str, fields: dict, out: Path, mode: str | None) -> None:
    """One rank's whole run; rank 0 writes ``history.json`` (its own rows) and ``state.pt``."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if mode is None:
        mode = "fsdp" if accelerator.distributed_type == DistributedType.FSDP else "ddp"
    config_class, trainer_class = config_and_trainer(algorithm)
    config = config_class(**{**fields, "device": str(accelerator.device)})
    require_data_parallel_run(algorithm, config, mode)
    trainer = trainer_class(config)
    make_data_parallel(trainer, mode)
    fit(trainer)
    state = {"model": full_state_dict(trainer.model)}
    stepped = trainer.stepped_models()
    if "critic" in stepped:  # RLHF-PPO's (never sharded: DDP only)
        state["critic"] = stepped["critic"][0].state_dict()
    if accelerator.is_main_process:
        torch.save(state, out / "state.pt")
        text = json.dumps({"world_size": accelerator.num_processes, "mode": mode,
                           "history": trainer.history}).encode()  # fmt: skip
        write_atomically(out / "history.json", lambda file: file.write(text))
    accelerator.end_training()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("algorithm", choices=ALGORITHMS)
    parser.add_argument("--config", required=True, help="a JSON file of the config's fields")
    parser.add_argument("--out", required=True, help="the folder for history.json and state.pt")
    parser.add_argument("--mode", choices=MODES, help="default: from Accelerate's config")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run(args.algorithm, json.loads(Path(args.config).read_text()), out, args.mode)


def launch(
    algorithm: str,
    fields: dict,
    out: str | os.PathLike,
    nproc: int = 2,
    mode: str = "ddp",
    timeout: float = 600.0,
) -> dict:
    """``algorithm``'s config ``fields`` trained on ``nproc`` CPU ranks with ``torchrun`` (gloo,
    loopback only); rank 0's ``history.json`` (its weights are in ``state.pt``)."""
    require(is_count(nproc), "nproc", "an integer >= 1", nproc)
    config_class, _ = config_and_trainer(algorithm)
    require_data_parallel_run(algorithm, config_class(**fields), mode)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(fields))
    arguments = [algorithm, "--config", str(out / "config.json"), "--out", str(out)]
    run_torchrun("rlkit.systems.data_parallel", [*arguments, "--mode", mode], nproc, timeout)
    return json.loads((out / "history.json").read_text())


if __name__ == "__main__":
    main()
