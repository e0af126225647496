"""The training objectives and their validation: uniform-state noise, the weighted denoising loss, the
AR FIM view of an example (causal loss), the context LM loss, and the learning-rate schedule."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from dfim.engine.model.config import ModelConfig
from dfim.engine.training.examples import Batch


def add_noise(
    canvas: torch.Tensor,
    pinned: torch.Tensor,
    vocab_size: int,
    t_min: float,
    gen=None,
    ordered_p: float = 0.0,
    pad_id: int = 0,
):
    """Uniform-state forward process: each unpinned position becomes a random token with prob. t.

    `ordered_p` > 0: that share of the rows is noised the way the sampler's left-to-right window
    (`order_window`) leaves a canvas mid-fill instead: clean left of a random cut inside the middle and
    its EOS, noised right of it at a high level t ~ U(0.5, 1) (the sampler renoises every position it did
    not accept). With i.i.d. noise alone the model never trains on the canvases it actually reads."""
    b, length = canvas.shape
    dev = canvas.device
    t = torch.rand(b, 1, device=dev, generator=gen) * (1 - t_min) + t_min
    u = torch.rand(b, length, device=dev, generator=gen)
    flip = u < t
    if ordered_p > 0:  # extra draws only when asked: default runs keep their random stream
        ordered = torch.rand(b, 1, device=dev, generator=gen) < ordered_p
        content = (canvas != pad_id).sum(dim=1, keepdim=True)  # middle + EOS
        cut = (torch.rand(b, 1, device=dev, generator=gen) * (content + 1)).floor()
        right = torch.arange(length, device=dev)[None] >= cut
        flip = torch.where(ordered, right & (u < 0.5 + 0.5 * t), flip)
    flip &= ~pinned
    noise = torch.randint(0, vocab_size, (b, length), device=dev, generator=gen)
    return torch.where(flip, noise, canvas), t


# The denominator of a weighted loss from its weights. Data-parallel training passes the sum over every
# rank's batch (`distributed.global_weight`), so summed gradients equal one process's over the whole batch.
Denominator = Callable[[torch.Tensor], torch.Tensor]


def local_weight(weight: torch.Tensor) -> torch.Tensor:
    return weight.sum().clamp(min=1.0)


def weighted_loss(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, denominator: Denominator = local_weight
) -> torch.Tensor:
    ce = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), reduction="none")
    return (ce * weight.flatten()).sum() / denominator(weight)


def lr_at(
    step: int, progress: float, peak: float, warmup: int, decay_share: float, min_ratio: float
) -> float:
    """Warmup-stable-decay: linear warmup, flat, then linear decay over the last `decay_share` of the plan.

    `progress` is the share of the planned run done (steps or seconds), so a run cut into resumable
    chunks of wall time still lands on its decay at the end of the plan."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    if progress <= 1 - decay_share:
        return peak * warm
    frac = min(1.0, (progress - (1 - decay_share)) / max(decay_share, 1e-9))
    return peak * warm * (1 - frac * (1 - min_ratio))


def evaluate(
    fwd, batches: Sequence[Batch], vocab_size: int, pad_id: int, device, autocast, ordered: bool = False
) -> dict[str, float]:
    """Validation loss and content accuracy under i.i.d. noise, or (`ordered`) under the sampler's
    left-to-right pattern on every row."""
    gen = torch.Generator(device=device).manual_seed(0)
    total, weight, correct, count = 0.0, 0.0, 0.0, 0.0
    with torch.no_grad(), autocast():
        for batch in batches:
            b = batch.to(device)
            noisy, _ = add_noise(b.canvas, b.pinned, vocab_size, 0.02, gen, float(ordered), pad_id)
            logits = fwd(b.context, noisy, None, b.context_pad)
            w = b.weight
            ce = F.cross_entropy(logits.flatten(0, 1).float(), b.canvas.flatten(), reduction="none")
            total += float((ce * w.flatten()).sum())
            weight += float(w.sum())
            content = ((b.canvas != pad_id) & ~b.pinned).flatten()  # middle + eos
            correct += float((logits.argmax(-1).flatten() == b.canvas.flatten())[content].sum())
            count += float(content.sum())
    return {"val_loss": total / max(weight, 1.0), "val_acc": correct / max(count, 1.0)}


def causal_sequence(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The AR view of a FIM example: `context middle <eos>` as one sequence (context left padded,
    pads after EOS on the right) -> (ids [B, N], left-pad mask [B, N], target weight [B, N-1]).

    Every real token after the first is a target, context included (the usual FIM language-model
    loss on the whole reordered document), so the AR model learns from all the text it reads."""
    ids = torch.cat([batch.context, batch.canvas], dim=1)
    pad = torch.cat([batch.context_pad, torch.zeros_like(batch.pinned)], dim=1)
    real = torch.cat([~batch.context_pad, batch.weight > 0], dim=1)
    weight = (real[:, 1:] & real[:, :-1]).float()
    return ids, pad, weight


def context_lm_loss(
    model, hidden: torch.Tensor, batch: Batch, denominator: Denominator = local_weight
) -> torch.Tensor:
    """Next-token loss on the encoder's pass over the context (hidden [B, n, H]): each real context
    token predicts the next one, and `<fim_middle>` (the last) predicts the first token of the clean
    canvas. Left pads neither predict nor are predicted (a real token is never followed by a pad)."""
    targets = torch.cat([batch.context[:, 1:], batch.canvas[:, :1]], dim=1)
    logits = model.logits(hidden)
    return weighted_loss(logits, targets, (~batch.context_pad).float(), denominator)


def causal_loss(
    model, batch: Batch, denominator: Denominator = local_weight, forward: Callable | None = None
) -> torch.Tensor:
    """The AR FIM loss over `context middle <eos>`; `forward` stands for `model.causal_forward_train`
    (its compiled form in training)."""
    ids, pad, weight = causal_sequence(batch)
    logits = (forward or model.causal_forward_train)(ids, pad)
    return weighted_loss(logits[:, :-1], ids[:, 1:], weight, denominator)


def validate(model, fwd, batches, causal: bool, config: ModelConfig, pad_id: int, device, autocast):
    if not causal:
        scores = evaluate(fwd, batches, config.vocab_size, pad_id, device, autocast)
        ordered = evaluate(fwd, batches, config.vocab_size, pad_id, device, autocast, ordered=True)
        return {**scores, "val_loss_ordered": ordered["val_loss"], "val_acc_ordered": ordered["val_acc"]}
    # AR: loss over every target as in training; accuracy over the middle and its EOS only, the
    # figure comparable to the diffusion model's content accuracy.
    total, weight, correct, count = 0.0, 0.0, 0.0, 0.0
    with torch.no_grad(), autocast():
        for batch in batches:
            b = batch.to(device)
            ids, pad, w = causal_sequence(b)
            logits = model.causal_forward_train(ids, pad)[:, :-1]
            target = ids[:, 1:]
            ce = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), reduction="none")
            total += float((ce * w.flatten()).sum())
            weight += float(w.sum())
            n = b.context.shape[1]
            middle = w[:, n - 1 :] > 0  # targets inside the canvas: middle + eos
            hit = logits[:, n - 1 :].argmax(-1) == target[:, n - 1 :]
            correct += float(hit[middle].sum())
            count += float(middle.sum())
    return {"val_loss": total / max(weight, 1.0), "val_acc": correct / max(count, 1.0)}
