"""The sampler's row-wise kernel (dfim.engine.inference.triton_sampler) against the PyTorch reads it replaces:
the mode (first index on a tie), the entropy, the log-normaliser and the inverse-CDF draw, over vocabularies
that are no multiple of its block, masked tokens and a row with one finite logit; and `Distribution` reading
through it. On CUDA, or on the CPU under Triton's interpreter where Triton is installed; without either (the
CPU-only install) these skip, and the CPU tests of the sampler cover the reference reads."""

from __future__ import annotations

import textwrap

import torch

from dfim.engine.inference import triton_sampler

CHECK = textwrap.dedent(
    """
    import sys
    import torch
    from dfim.engine.inference import triton_sampler
    from dfim.engine.inference.sampler_state import Distribution

    device = sys.argv[1]
    bad = triton_sampler.mismatches(device)
    g = torch.Generator().manual_seed(1)
    for vocab in (17, 4096, 9000):
        logits = (torch.randn(2, 3, vocab, generator=g) * 4).to(device)
        logits[0, 1, :] = -float("inf")
        logits[0, 1, vocab // 2] = 0.0  # one finite logit: certain, entropy 0
        logits[1, 0, 3] = logits[1, 0, min(3 + 4096, vocab - 1)] = logits[1, 0].max() + 1  # a tie; one lane at 9000
        u = torch.rand(2, 3, generator=g).to(device)
        got, want = triton_sampler.row_stats(logits, u), triton_sampler.reference(logits, u)
        rows = logits.reshape(-1, vocab)
        draws = zip(rows, u.reshape(-1), got.sampled.reshape(-1).tolist())
        if not torch.equal(got.mode, want.mode) or not all(triton_sampler.valid_draw(*d) for d in draws):
            bad.append(f"V={vocab}: mode/draw {got.mode.tolist()} {got.sampled.tolist()}")
        if not torch.allclose(got.entropy, want.entropy, atol=1e-4) or float(got.entropy[0, 1]) != 0.0:
            bad.append(f"V={vocab}: entropy {got.entropy.tolist()} against {want.entropy.tolist()}")
        if not torch.allclose(got.log_normalizer, want.log_normalizer, atol=1e-4):
            bad.append(f"V={vocab}: log-normaliser")
        dist = Distribution(logits)
        drawn = dist.sample(u)
        ids = want.mode
        if not torch.equal(drawn, got.sampled) or not torch.equal(dist.mode, want.mode):
            bad.append(f"V={vocab}: Distribution did not read the kernel's draw and mode")
        log_p = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        if not torch.allclose(dist.log_prob(ids), log_p, atol=1e-4):
            bad.append(f"V={vocab}: log_prob")
        if "probs" in dist.__dict__:
            bad.append("the kernel's path computed the whole softmax")
    print("\\n".join(bad) or "ok")
    """
)


def test_kernel_matches_the_reference(kernel_check, kernel_target):
    kernel_check(CHECK, *kernel_target)


def test_the_reference_reads_what_the_distribution_reads():
    """The kernel's reference is the CPU path's arithmetic: the same mode, entropy and draw."""
    from dfim.engine.inference.sampler_state import Distribution

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g) * 2
    logits[:, ::5] = -float("inf")
    u = torch.rand(3, generator=g)
    dist, want = Distribution(logits), triton_sampler.reference(logits, u)
    assert torch.equal(dist.sample(u), want.sampled)
    assert torch.equal(dist.mode, want.mode)
    assert torch.allclose(dist.entropy, want.entropy)
    assert torch.allclose(
        dist.log_prob(want.mode), logits.max(dim=-1).values - want.log_normalizer, atol=1e-6
    )
