"""The engine's public types: what a front end (CLI, server, eval) sends and gets back.

The engine never imports the server; front ends only need these types and `engine.Engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


class EngineError(Exception):
    """A request the engine cannot serve; the message is one line meant for a person."""


class CheckpointError(EngineError):
    """A checkpoint folder is missing, incomplete or corrupt. The message names the path and the problem."""


class FillCancelled(EngineError):
    """The caller's cancel flag was raised between two denoising steps."""


RANKS = ("entropy", "likelihood")  # SamplerSettings.rank


DRAFT_FROM = ("prefix", "middle")


def parse_draft_from(value: object) -> str:
    """A SamplerSettings.draft_from from a config file or the command line; ValueError when it is not one."""
    if value not in DRAFT_FROM:
        raise ValueError(f"draft_from must be one of {', '.join(DRAFT_FROM)}, got {value!r}")
    return str(value)


def parse_rank(value: object) -> str:
    """A SamplerSettings.rank from a config file or the command line; ValueError when it is not one."""
    if value not in RANKS:
        raise ValueError(f"rank must be one of {', '.join(RANKS)}, got {value!r}")
    return str(value)


@dataclass(frozen=True)
class SamplerSettings:
    """Denoising knobs. Defaults equal the released DiffusionGemma `generation_config.json`."""

    max_steps: int = 48
    entropy_bound: float = 0.1
    t_max: float = 0.8  # temperature at the first step
    t_min: float = 0.4  # temperature at the last step
    stability_threshold: int = 1  # steps the argmax canvas must stay unchanged before stopping
    confidence_threshold: float = 0.005  # mean entropy under which a stable canvas may stop
    early_stop: bool = True  # False: always run max_steps (for sweeps)
    self_conditioning: bool = True
    # Left-to-right window (0 = off, the released sampler): a step may accept only free positions before
    # the first one the previous step left undecided plus this many. See `order_window` in the sampler.
    window: int = 0
    # How the candidates of one request are ranked (FillRequest.candidates > 1). "entropy": the mean entropy
    # of their free text positions (the denoiser's own confidence). "likelihood": the encoder read as a
    # causal LM (what training's context LM loss taught it) scores the prefix continued by each candidate
    # and the head of the suffix; the most likely document wins. One short causal pass per candidate.
    rank: str = "entropy"
    # Encoder draft (off: the released sampler). The encoder, read as a causal LM (what training's context LM
    # loss taught it), continues the prefix greedily, a cheap pass per token; its text seeds the first
    # candidate's canvas instead of noise. The denoiser then reads that canvas whole, with the suffix, and
    # the usual rules decide: it stops at once where its argmax reproduces the draft and is confident, and
    # otherwise keeps or renoises each position as for any canvas. See `engine/inference/draft.py`.
    draft: bool = False
    # Where the draft starts. "prefix": the prefix's own text continued (all a context LM loss teaches; the
    # draft ends where it leaves the hole). "middle": after `<fim_middle>`, as an AR FIM model decodes,
    # ending at its EOS; only for a checkpoint trained with the AR FIM loss (`dfim.engine.training.train --causal-weight`).
    draft_from: str = "prefix"


@dataclass(frozen=True)
class Hole:
    """A run of canvas tokens to denoise inside a middle skeleton."""

    width: int


@dataclass
class StepInfo:
    """Reported after every denoising step (progress bars, `$/progress`, traces), and once before them for a
    drafted canvas: step 0 is the encoder's draft (its `confidence` the encoder's probability of each token
    it wrote, `mean_entropy` 0, every position counted as accepted)."""

    step: int  # 1-based; 0: the encoder's draft
    max_steps: int
    accepted: int  # canvas positions accepted (not renoised) this step
    canvas_length: int
    mean_entropy: float
    argmax_text: str  # what the canvas reads now if it were committed
    block: int = 0  # 0-based canvas index when a long fill runs over several canvases
    # Per canvas position, for the best-first row 0 (traces); empty where a caller builds a StepInfo itself.
    token_ids: list[int] = field(default_factory=list)  # the argmax canvas, pins forced, pad after EOS
    tokens: list[str] = field(default_factory=list)  # their text ("" for special tokens: EOS, pad)
    confidence: list[float] = field(default_factory=list)  # exp(-entropy) of this step's distribution
    accepted_mask: list[bool] = field(default_factory=list)  # kept this step; False: renoised
    pinned: list[bool] = field(default_factory=list)
    # Token healing (block 0): the prefix's last characters, backed off it, that canvas position 0 re-writes.
    heal: str = ""
    # Row 0's stop checks this step (`DenoiseState.checks`): "stable" (the argmax canvas repeated), "doubt"
    # (mean entropy of the text's free positions), "end_settled" (every token up to the text's end confident).
    checks: dict[str, float] = field(default_factory=dict)


@dataclass
class FillRequest:
    """Fill the middle between `prefix` and `suffix`.

    `middle` is an optional skeleton: strings are pinned verbatim, `Hole`s are denoised. Empty means one open
    hole of up to `max_tokens` tokens that ends at the first EOS. The last `Hole` of a skeleton may also end
    early with EOS; inner holes are filled to their width.
    """

    prefix: str
    suffix: str
    middle: Sequence[str | Hole] = ()
    max_tokens: int = 64  # rounded up to a canvas bucket (16/32/64/128/256)
    warm_start: str | None = None  # rewrite: the old text seeds the open canvas (not pinned)
    warm_start_noise: float = 0.5  # fraction of the warm-start tokens renoised before the first step
    settings: SamplerSettings = field(default_factory=SamplerSettings)
    seed: int | None = None
    # The text ends before the first of these strings (a single-line fill stops at "\n"): a causal
    # checkpoint stops decoding there, a diffusion canvas is cut there.
    stop: tuple[str, ...] = ()
    candidates: int = 1  # >1: that many canvases denoised in one batch; results best-first
    cancel: Callable[[], bool] | None = None  # polled between steps; True raises FillCancelled
    on_step: Callable[[StepInfo], None] | None = None
    # Called in the engine's thread at every step boundary, before `cancel` is polled. A host runs more
    # urgent fills there (an inline completion while a long code action denoises); a fill run from
    # there must name another `cache_slot`, since this fill's context stays in its own.
    between_steps: Callable[[], None] | None = None
    # Which context KV cache the fill reuses. Requests that follow each other (keystrokes) should share a
    # slot; unrelated streams (inline fills, code actions) keep their own so neither evicts the other.
    cache_slot: str = "main"
    # The text after the fill in the finished document, where it is not `suffix`: a fill shown as a new line
    # above the code after the cursor is followed by a line break, not glued to that code. Likelihood
    # ranking (SamplerSettings.rank) scores candidates against it; the denoiser still sees `suffix`.
    scored_suffix: str | None = None
    # Texts a draft must not write again (a retry after the server dropped them): the greedy decode leaves
    # them at the first word where it would follow one, taking the next most likely token there.
    avoid: tuple[str, ...] = ()
    # What a rewrite (a warm start) should change, in words. Only an instruction-tuned checkpoint reads it
    # (dfim.engine.inference.chat); a FIM checkpoint has no way to.
    instruction: str = ""


@dataclass
class TokenScore:
    text: str
    confidence: float  # exp(-entropy) of the final distribution at that position, in (0, 1]
    pinned: bool = False


@dataclass
class FillResult:
    text: str  # the middle, pins included, cut at the first EOS, token healing undone
    steps: int
    canvas_length: int
    tokens: int  # committed non-pad tokens
    encoded_tokens: int  # context tokens the encoder ran for this request (the rest came from the cache)
    context_tokens: int
    latency_ms: float
    # "stable" | "eos_confident" | "stop_confident" (settled up to a stop token) | "max_steps" (last canvas)
    stop_reason: str
    blocks: int = 1  # canvases denoised one after the other (long fills continue past one canvas)
    token_scores: list[TokenScore] = field(default_factory=list)
    alternatives: list[str] = field(default_factory=list)  # other candidates' texts, best first
    threads: int = 0  # torch CPU threads the fill ran with (0: not on the CPU); dfim.engine.model.threads
