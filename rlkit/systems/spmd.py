"""Multiple controllers (Chapter 13): the same program on every rank (SPMD, as Megatron and
DeepSpeed-Chat run), launched by ``torchrun`` on the gloo backend.

Each rank hosts every role of Chapter 11's GRPO dataflow or Chapter 10's RLHF-PPO dataflow
(``LocalHost``) and drives its own iteration (``GRPODataflow``, ``PPODataflow``): it draws the
global batch of prompts from the run's one stream, keeps its share of them, samples with its own
random stream, scores, and computes its advantages. GRPO's groups need no other rank (a group
never spans ranks); RLHF-PPO's whitening reads the mean and variance over every rank's tokens, and
its adaptive KL coefficient the mean KL over the ranks (``AcrossRanks``). The ranks meet once per
optimizer step: after each has accumulated its gradient, the gradients are averaged over the ranks
(eq-data-parallel), so that every rank takes the same step and the weights stay equal.

For a loss that is a mean over completions (GRPO's ``loss_type`` "grpo" or "dr_grpo") the mean of
the ranks' gradients is the gradient of the global batch; for a token mean over the batch
(RLHF-PPO's policy and value losses, GRPO's "dapo") each rank's gradient is weighed by its share of
the tokens. One step on ``W`` ranks then equals one step of the single process on the same
completions, up to the order of the float sums (each step on the whole batch: minibatches are
refused, since each rank would shuffle only its own share).

Run it as ``torchrun --nproc-per-node 2 -m rlkit.systems.spmd --config run.json --out folder``, or
from Python with ``launch``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from rlkit.checkpoint import write_atomically
from rlkit.llm.grpo import GRPOConfig
from rlkit.llm.rlhf_ppo import RLHFPPOConfig
from rlkit.systems.dataflow import dataflow_for, require_dataflow_settings, roles_needed
from rlkit.systems.processes import stop_processes
from rlkit.systems.roles import LocalHost
from rlkit.training import is_count, require

__all__ = [
    "AcrossRanks",
    "GradientAverager",
    "launch",
    "rank_config",
    "require_data_parallel_settings",
]

# losses whose global gradient the ranks' weighted mean is: means over completions, and "dapo"'s
# token mean over the whole batch (each rank weighed by its tokens); "bnpo" averages token means
DATA_PARALLEL_LOSSES = ("grpo", "dr_grpo", "dapo")


def require_data_parallel_settings(config: GRPOConfig | RLHFPPOConfig, world_size: int) -> None:
    """The settings whose step on ``world_size`` ranks is the single process's step."""
    require_dataflow_settings(config)
    if isinstance(config, RLHFPPOConfig):
        require(
            config.batch_size % world_size == 0,
            "batch_size",
            f"a multiple of the number of ranks ({world_size})",
            config.batch_size,
        )
        require(
            config.minibatch_size == config.batch_size,
            "minibatch_size",
            f"the batch ({config.batch_size}) under data parallelism: each rank would shuffle "
            "its own share, and a step would not be the single process's",
            config.minibatch_size,
        )
        return
    require(
        config.prompts_per_iteration % world_size == 0,
        "prompts_per_iteration",
        f"a multiple of the number of ranks ({world_size}): each rank takes whole groups",
        config.prompts_per_iteration,
    )
    require(
        config.loss_type in DATA_PARALLEL_LOSSES,
        "loss_type",
        f"one of {DATA_PARALLEL_LOSSES} under data parallelism ('bnpo' averages each "
        "micro-batch's token mean, and a rank's share would be a micro-batch of its own)",
        config.loss_type,
    )
    require(
        config.scale != "batch",
        "scale",
        "'group' or 'none' under data parallelism (the batch's std would be each rank's)",
        config.scale,
    )
    require(
        config.minibatch_size in (None, config.batch_size),
        "minibatch_size",
        f"None (or the batch, {config.batch_size}) under data parallelism: each rank would "
        "shuffle its own share, and a step would not be the single process's",
        config.minibatch_size,
    )


def rank_config(config: GRPOConfig | RLHFPPOConfig, world_size: int) -> GRPOConfig | RLHFPPOConfig:
    """One rank's share of the run: its prompts per iteration (one minibatch of them)."""
    if isinstance(config, RLHFPPOConfig):
        share = config.batch_size // world_size
        return dataclasses.replace(config, batch_size=share, minibatch_size=share)
    return dataclasses.replace(
        config,
        prompts_per_iteration=config.prompts_per_iteration // world_size,
        minibatch_size=None,
    )


class GradientAverager:
    """Replaces every rank's gradient with the ranks' mean weighed by each rank's share of the
    step's weight, ``g = sum_r n_r g_r / sum_r n_r``, where ``n_r`` is what rank ``r``'s loss is a
    mean over (its completions, tokens or pairs: the total weight ``optimizer_step`` hands over).
    With equal shares it is ``g = (1/W) sum_r g_r`` (eq-data-parallel). One all-reduce of the
    weights, one over all the gradients flattened into one buffer (DDP does the latter in
    buckets, overlapped with the backward pass). Counts the seconds it spends."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self, model: torch.nn.Module, weight: float) -> None:
        start = time.perf_counter()
        trained = [p for p in model.parameters() if p.requires_grad]
        for parameter in trained:  # every rank sends every gradient, or the all-reduce would hang
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        grads = [parameter.grad for parameter in trained]
        total = torch.tensor([weight], dtype=torch.float64, device=grads[0].device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        total = total.item()
        # no rank with any weight (every completion truncated and masked): nothing to average
        share = weight * dist.get_world_size() / total if total > 0 else 0.0
        flat = torch.cat([grad.flatten() for grad in grads]) * share
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= dist.get_world_size()
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
        self.seconds += time.perf_counter() - start


class AcrossRanks:
    """What a rank's driver or trainer combines over every rank (``OneProcess`` in one process): a
    statistic's mean, and the whitening of the advantages over every rank's valid tokens, with
    ``masked_whiten``'s mean and unbiased variance."""

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    def mean(self, value: float) -> float:
        total = torch.tensor([value], dtype=torch.float64, device=collective_device())
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.item() / dist.get_world_size()

    def whiten(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        valid = mask.to(x.dtype)
        x = x * valid

        def summed(*values):
            total = torch.stack(values)
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            return total

        total, count = summed(x.sum(), valid.sum())
        centred = x - total / count
        (squares,) = summed((centred**2 * valid).sum())
        require(count >= 2, "batch_size", "at least 2 valid tokens over the ranks", int(count))
        return centred * torch.rsqrt(squares / (count - 1) + 1e-8) * valid


def collective_device() -> torch.device:
    """Where a small tensor for a collective lives: NCCL's collectives take CUDA tensors only."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_parameters(model: torch.nn.Module) -> None:
    """Every rank starts from rank 0's weights (as DDP does when it wraps a model)."""
    for parameter in model.parameters():
        dist.broadcast(parameter.data, src=0)


def rank_seed(seed: int, rank: int) -> int:
    """Rank 0 keeps the run's own stream (one rank is the single process); the others get streams
    of their own, derived from ``(seed, rank)``."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def mean_over_ranks(row: dict[str, float]) -> dict[str, float]:
    """The history row averaged over the ranks (each rank's statistics are its own share's)."""
    names = sorted(row)
    values = torch.tensor(
        [float(row[name]) for name in names], dtype=torch.float64, device=collective_device()
    )
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    values /= dist.get_world_size()
    return dict(zip(names, values.cpu().tolist()))


def trained_models(host: LocalHost) -> dict[str, tuple]:
    """Each phase that steps a model (the actor's "policy", RLHF-PPO's "critic"): its trainer,
    model and optimizer."""
    trained = {}
    for phase, role in (("policy", "actor"), ("critic", "critic")):  # the role that steps each
        if role in host.roles:
            trainer = host.roles[role].trainer
            trained[phase] = (trainer, *trainer.stepped_models()[phase])
    return trained


def run_rank(
    config: GRPOConfig | RLHFPPOConfig, out: Path, num_iterations: int, save_rollout: bool
) -> None:
    """One rank's whole run: its roles, its share of every iteration, the averaged steps."""
    rank, world = dist.get_rank(), dist.get_world_size()
    require_data_parallel_settings(config, world)
    local = rank_config(config, world)
    roles = roles_needed(config)
    host = LocalHost(local, roles)
    trained, averagers = trained_models(host), {}
    for phase, (trainer, model, _) in trained.items():
        broadcast_parameters(model)
        averagers[phase] = GradientAverager()
        trainer.average_gradients = averagers[phase]
    if rank > 0:  # rank 0 goes on with the stream its trainer seeded (it is the single process)
        torch.manual_seed(rank_seed(config.seed, rank))
    ranks = dict(rank=rank, world_size=world, ranks=AcrossRanks())
    flow = dataflow_for(local, dict.fromkeys(roles, host), **ranks)
    flow.keep_rollouts = save_rollout
    history = []
    for _ in range(num_iterations):
        for averager in averagers.values():
            averager.seconds = 0.0
        row = flow.run_iteration()
        for phase, averager in averagers.items():
            row[f"seconds_{phase}"] -= averager.seconds
        row["seconds_communication"] = sum(averager.seconds for averager in averagers.values())
        history.append(mean_over_ranks(row))
    if save_rollout:
        torch.save(flow.rollouts[0], out / f"rollout-rank{rank}.pt")
    if rank == 0:
        state = {}
        for phase, (_, model, optimizer) in trained.items():
            prefix = "" if phase == "policy" else f"{phase}_"
            state |= {
                f"{prefix}model": model.state_dict(),
                f"{prefix}optimizer": optimizer.state_dict(),
            }
        torch.save(state, out / "state.pt")
        text = json.dumps({"world_size": world, "history": history}).encode()
        write_atomically(out / "history.json", lambda file: file.write(text))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", required=True, help="a JSON file of the config's fields and its algorithm"
    )
    parser.add_argument("--out", required=True, help="the folder for history.json and state.pt")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--save-rollout", action="store_true", help="each rank's first rollout")
    args = parser.parse_args(argv)
    fields = json.loads(Path(args.config).read_text())
    algorithm = fields.pop("algorithm", None)
    require(algorithm in ("grpo", "rlhf_ppo"), "algorithm", "'grpo' or 'rlhf_ppo'", algorithm)
    config_class = RLHFPPOConfig if algorithm == "rlhf_ppo" else GRPOConfig
    config = config_class(**fields)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    try:
        iterations = config.num_iterations if args.iterations is None else args.iterations
        run_rank(config, out, iterations, args.save_rollout)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def failure_report(stderr: str, nproc: int) -> str:
    """torchrun's report of a failed run, led by the rank that failed first and how."""
    root = stderr[stderr.find("Root Cause") :] if "Root Cause" in stderr else ""
    rank = re.search(r"rank\s*:\s*(\d+)", root)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", root)
    first = "a rank failed"
    if rank and code:
        how = int(code.group(1))
        cause = f"killed by signal {-how}" if how < 0 else f"exit code {how}"
        first = f"rank {rank.group(1)} failed first ({cause})"
    return f"torchrun on {nproc} ranks: {first}; the others were stopped.\n{stderr[-3000:]}"


def launch(
    config: GRPOConfig | RLHFPPOConfig,
    out: str | os.PathLike,
    nproc: int = 2,
    num_iterations: int | None = None,
    save_rollout: bool = False,
    timeout: float = 600.0,
) -> dict:
    """Run ``config`` on ``nproc`` ranks with ``torchrun`` (gloo, loopback only, one thread per
    rank) and return rank 0's history (``history.json``; its model and optimizer are in
    ``state.pt``). A rank that fails stops the others (torchrun's agent), and this raises a
    RuntimeError with torchrun's report; past ``timeout`` seconds torchrun and every rank are
    stopped, and a RuntimeError says so."""
    require(is_count(nproc), "nproc", "an integer >= 1", nproc)
    require_data_parallel_settings(config, nproc)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    algorithm = "rlhf_ppo" if isinstance(config, RLHFPPOConfig) else "grpo"
    (out / "config.json").write_text(
        json.dumps({"algorithm": algorithm, **dataclasses.asdict(config)})
    )
    arguments = ["--config", str(out / "config.json"), "--out", str(out)]
    if num_iterations is not None:
        arguments += ["--iterations", str(num_iterations)]
    if save_rollout:
        arguments.append("--save-rollout")
    run_torchrun("rlkit.systems.spmd", arguments, nproc, timeout)
    return json.loads((out / "history.json").read_text())


def run_torchrun(module: str, arguments: list[str], nproc: int, timeout: float) -> None:
    """``torchrun -m module *arguments`` on ``nproc`` ranks (gloo, loopback only, one thread per
    rank). A rank that fails stops the others (torchrun's agent), and this raises a RuntimeError
    with torchrun's report; past ``timeout`` seconds torchrun and every rank are stopped, and a
    RuntimeError says so."""
    command = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
        "-m", module, *arguments,
    ]  # fmt: skip
    environment = os.environ | {
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    with subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as torchrun:
        try:
            _, stderr = torchrun.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_process_tree(torchrun.pid)
            torchrun.communicate()
            raise RuntimeError(
                f"torchrun on {nproc} ranks did not finish within {timeout} s: it and its ranks "
                "were stopped"
            ) from None
    if torchrun.returncode != 0:
        raise RuntimeError(failure_report(stderr, nproc))


def stop_process_tree(pid: int, grace: float = 10.0) -> None:
    """Stops a process and every process below it: torchrun starts each rank in a session of its
    own, so killing torchrun alone would leave its ranks running (blocked in a collective)."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    stop_processes(processes, grace)


if __name__ == "__main__":
    main()
