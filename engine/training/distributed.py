"""Data-parallel training on every GPU of one machine (torchrun), and the throughput figures it logs.

Gradients are all-reduced by hand after backward rather than through DistributedDataParallel: a step
calls several methods of the model (`forward_train_lm`, `causal_forward_train`, `logits`) besides a
no-grad self-conditioning pass, while DDP only hooks `forward`; and some parameters get no gradient on
some steps (the encoder's layer scalars in a causal run, experts no token was routed to), which DDP
handles only with `find_unused_parameters` and its extra graph walk. One flat all-reduce per step of a
model this small (tens of MB) costs well under a millisecond over NVLink, so overlapping it with
backward, DDP's advantage, is worth little here.

Losses are normalised by the weight summed over ALL ranks (`global_weight`), and the gradients are
summed, so a step over N ranks computes exactly the gradient of one process holding the whole batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

# bf16 dense peak FLOP/s by device name (substring, checked in order): the denominator of the model
# FLOPs utilisation. Vendor datasheet figures without sparsity.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
)


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (rank 0 of 1 when not under torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Only this process logs, validates, saves the state and exports."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def init_world(device_name: str | None) -> tuple[World, torch.device]:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK in the environment): nccl
    with one GPU per process (cuda:LOCAL_RANK), gloo on CPU. Without torchrun: a world of one and the
    device as asked (--device, else CUDA where there is one)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    wanted = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if size == 1:
        return World(), wanted
    if wanted.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = wanted
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    return World(rank, size, local_rank), device


def close_world(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_parameters(model: torch.nn.Module, world: World) -> None:
    """Every rank starts from rank 0's weights (the seeded init is the same everywhere; a loaded state
    is too, but one broadcast makes it certain)."""
    if not world.distributed:
        return
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=0)


def global_sum(values: list[float], device: torch.device, world: World) -> list[float]:
    """Sum small scalars over the ranks (one collective); a world of one returns them unchanged."""
    if not world.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def global_weight(weight: torch.Tensor, world: World) -> torch.Tensor:
    """The sum of a loss's weights over every rank's batch: the shared denominator that makes N ranks'
    summed gradients equal one process's gradient over the whole batch."""
    total = weight.detach().float().sum()
    if world.distributed:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.clamp(min=1.0)


def sum_gradients(model: torch.nn.Module, world: World) -> None:
    """All-reduce (sum) every parameter's gradient in one flat buffer. A parameter without a gradient on
    this rank contributes zeros; one no rank reached keeps no gradient (as in one process, where AdamW
    then skips it: no weight decay, no moment update). Every rank ends with the same gradients."""
    if not world.distributed:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    reached = [float(p.grad is not None) for p in params]
    device = next(iter(params)).device
    flat = torch.cat(
        [
            torch.zeros(p.numel(), device=device) if p.grad is None else p.grad.reshape(-1).float()
            for p in params
        ]
        + [torch.tensor(reached, device=device)]
    )
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    reached_anywhere = flat[-len(params) :].tolist()  # one device sync, not one per parameter
    offset = 0
    for p, count in zip(params, reached_anywhere, strict=True):
        n = p.numel()
        if count > 0:
            summed = flat[offset : offset + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = summed.clone()
            else:
                p.grad.copy_(summed)
        else:
            p.grad = None
        offset += n


def active_parameters(model: torch.nn.Module) -> int:
    """Parameters one token passes through: all, less the experts it is not routed to (top-k of the
    experts), less the encoder's per-layer scalars (a few numbers). The tied embedding counts once,
    as the LM head's matrix product."""
    config = model.config  # type: ignore[attr-defined]
    total = sum(p.numel() for p in model.parameters())
    experts = 0
    for layer in model.decoder.layers:  # type: ignore[attr-defined]
        experts += layer.experts.gate_up_proj.numel() + layer.experts.down_proj.numel()
    unused = experts * (config.num_experts - config.top_k_experts) // max(config.num_experts, 1)
    return total - unused


def peak_flops(device: torch.device, override_tflops: float = 0.0) -> float:
    """bf16 dense peak FLOP/s of one device: --peak-tflops when given, else the table by device name;
    0 where unknown (CPU, an unlisted GPU): no utilisation is logged then."""
    if override_tflops > 0:
        return override_tflops * 1e12
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), 0.0)


def step_flops(active: int, tokens: int, self_conditioned: bool, causal_extra: bool, causal: bool) -> float:
    """Model FLOPs of one step on `tokens` tokens (context + canvas): 6 per active parameter per token
    for the trained pass, 2 more for a no-grad self-conditioning pass, 6 more for the extra AR FIM
    pass of --causal-weight. Attention's own score FLOPs are left out (small at this width and context)."""
    passes = 6.0
    if not causal:
        passes += 2.0 if self_conditioned else 0.0
        passes += 6.0 if causal_extra else 0.0
    return passes * active * tokens
