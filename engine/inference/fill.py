"""The engine: fill the middle between a prefix and a suffix with a DiffusionGemma checkpoint.

    engine = Engine.load()                       # the shipped model (or Engine.load("path/to/ckpt"))
    result = engine.fill(FillRequest(prefix="def add(a, b):\\n    return ", suffix="\\n"))
    print(result.text, result.steps, result.stop_reason)

One fill: build the canvas plan (canvas.py), bring the context into the KV cache reusing what the
previous request left there (cache.py), denoise the canvas batch with the sampler chain (sampler.py),
and if the open hole ran to the canvas end without an EOS and the request wants more tokens, encode
that block into the cache and denoise the next canvas, whose positions continue after it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dfim.engine.api import (
    CheckpointError,
    EngineError,
    FillRequest,
    FillResult,
    SamplerSettings,
    StepInfo,
    parse_rank,
)
from dfim.engine.inference import autoregressive, confidence, draft, sampler, triton_sampler
from dfim.engine.inference.cache import ContextCache, common_prefix_length
from dfim.engine.inference.canvas import (
    CanvasPlan,
    TokenTable,
    assemble_text,
    bucket_length,
    build_canvas,
    continuation_plan,
    cut_at_stop,
    middle_tokens,
)
from dfim.engine.inference.chat import load_tokenizer
from dfim.engine.inference.fast_backend import FastBackend
from dfim.engine.inference.sampler_state import DenoiseState, mean_free_entropy, plan_constraints
from dfim.engine.inference.sampler_steps import build_chain
from dfim.engine.model.checkpoint import folder_not_found, load_model, read_info, resolve_checkpoint
from dfim.engine.model.threads import AdaptiveThreads, limit_threads, usable_cores
from dfim.engine.model.tokenizer import Tokenizer

# Context tokens the fast path's static cache holds (beyond it a fill denoises on the plain network): the
# server's largest context window (`context.prefix_tokens`) with the canvas and a continuation block after it.
FAST_MAX_CONTEXT = 8192 + 512
SUFFIX_HEAD_CHARS = 48  # suffix text a candidate's likelihood includes (the line break and code after it)
MAX_CACHE_SLOTS = 4  # context caches an engine keeps (FillRequest.cache_slot); each holds one context's keys


def check_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise EngineError(f"unknown device {device!r} (use cpu or cuda)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {device!r} requested but CUDA is not available on this machine")
    return dev


@dataclass
class _Candidate:
    """One canvas row's committed text so far, over one or more blocks."""

    tokens: list[tuple[int, float, bool]] = field(default_factory=list)  # (id, confidence, pinned)
    logprobs: list[float] = field(default_factory=list)  # per token of `tokens`: log p of that token
    block_ids: list[int] = field(default_factory=list)  # all committed positions, for continuation
    free_entropy: list[float] = field(default_factory=list)  # of free text positions (ranking)
    committed: int = 0  # non-pad committed tokens (EOS included)
    steps: int = 0
    blocks: int = 0
    ended: bool = False
    stop_reason: str = "max_steps"
    likelihood: float = 0.0  # log p of the document with this text (SamplerSettings.rank == "likelihood")

    @property
    def score(self) -> float:
        """Mean entropy of the free positions that carry text: lower is better."""
        return sum(self.free_entropy) / len(self.free_entropy) if self.free_entropy else 0.0


class Engine:
    """A loaded checkpoint with its tokenizer and context caches.

    `fill` is serialized by a re-entrant lock: a fill may run another fill from its `between_steps` hook
    (in the same thread, at a step boundary) as long as the two use different cache slots."""

    def __init__(
        self,
        model,
        tokenizer: Tokenizer,
        settings: SamplerSettings,
        model_name: str,
        is_random: bool,
        path: Path,
        objective: str = "diffusion",
        trained_context: int | None = None,
        threads: AdaptiveThreads | None = None,
        fast: bool = False,
        fast_compile: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.model_name = model_name
        self.is_random = is_random
        self.path = path
        self.device = next(model.parameters()).device
        self.canvas_limit = int(model.config.canvas_length)
        self.vocab_size = int(model.config.vocab_size)
        self.table = TokenTable(tokenizer, self.vocab_size)
        # "causal": an AR checkpoint (the evaluation's baseline), filled by dfim.engine.inference.autoregressive.
        self.objective = objective
        # Context tokens the checkpoint was trained with (dfim.json `context_tokens`); None: unknown.
        # Front ends keep their windows within it (dfim.server.context.fit_context_budget).
        self.trained_context = trained_context
        self.caches: dict[str, ContextCache] = {}  # by FillRequest.cache_slot, created on first use
        self._busy_slots: set[str] = set()  # slots of the fills running now (the outer one, a nested one)
        self.banned = self._banned_tokens()
        self._stop_masks: dict[tuple[str, ...], tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        self._lock = threading.RLock()
        # CPU only, when nobody fixed a thread count: every core for a fill while the machine is quiet.
        self.threads = threads
        # The fast path (`dfim.engine.inference.fast_backend`) denoises, built on the first diffusion fill:
        # static KV cache, CUDA graphs, grouped experts; the same sampler chain runs on its logits.
        self.fast = fast and objective == "diffusion"
        self.fast_max_len = FAST_MAX_CONTEXT
        self.fast_bucket = 256  # cache rows per graph: one captured decoder pass serves a bucket of lengths
        # torch.compile the layers the fast path runs: fused norms and activations, about 1.3x per pass on
        # an H200 at the 26B shape, but the first fill of each new shape waits for the compiler.
        self.fast_compile = fast_compile
        self._fast_backend: FastBackend | None = None

    @classmethod
    def load(
        cls,
        path: str | os.PathLike | None = None,
        device: str = "cpu",
        threads: int | None = None,
        fast: bool | None = None,
        compile: bool = False,
        dtype: torch.dtype | None = None,
    ) -> Engine:
        """`threads`: torch's CPU thread count (default: `dfim.engine.model.threads`: one core fewer than this process
        may use, every core while the others are idle). `fast`: denoise on the fast path (default: on CUDA).
        `compile`: torch.compile the fast path's layers (`Engine.fast_compile`). `dtype`: the weights' dtype
        (default: bf16 on a GPU, fp32 on the CPU; checks that compare two backends ask for fp32)."""
        folder = resolve_checkpoint(path)
        try:
            dev = check_device(device)
        except EngineError as exc:
            if not folder.is_dir():  # both wrong: say both, or fixing one only brings up the other
                raise EngineError(f"{folder_not_found(folder)}; and {exc}") from None
            raise
        automatic = limit_threads(threads)
        if not folder.is_dir():
            raise folder_not_found(folder)
        tokenizer_path = folder / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise CheckpointError(f"{tokenizer_path}: missing")
        try:
            tokenizer = load_tokenizer(folder)
        except CheckpointError:
            raise
        except Exception as err:  # tokenizers raises plain Exceptions for unreadable files
            raise CheckpointError(f"{tokenizer_path}: not a usable tokenizer ({err})") from None
        # bf16 on a GPU, as the fast path and the checkpoints' own training run: fp32 would double the bytes
        # every step reads. The CPU keeps fp32 (its products and int8 kernels are written for it).
        if dtype is None:
            dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        # An FP8 checkpoint's experts stay FP8 on a GPU (half the bytes a pass reads; the Triton kernel widens
        # them tile by tile); the CPU dequantizes them at load, as it has no FP8 kernels.
        model, settings = load_model(folder, device=str(dev), dtype=dtype, fp8_experts=dev.type == "cuda")
        if tokenizer.chat and settings.draft:  # the draft reads the FIM layout (dfim.engine.inference.chat)
            settings = dataclasses.replace(settings, draft=False)
        if dev.type == "cpu":
            model.prepare_cpu_inference()  # fused and transposed weights: same values, faster products
        if tokenizer.vocab_size > model.config.vocab_size:
            raise CheckpointError(
                f"{folder}: tokenizer.json has {tokenizer.vocab_size} tokens, the model only {model.config.vocab_size}"
            )
        info = read_info(folder)
        is_random = bool(info.get("random") or info.get("dfim_random"))
        name = str(info.get("name") or folder.name)
        objective = str(info.get("objective") or "diffusion")
        trained = info.get("context_tokens")
        trained_context = trained if isinstance(trained, int) and trained > 0 else None
        if objective not in ("diffusion", "causal"):
            raise CheckpointError(f"{folder}: dfim.json names an unknown objective {objective!r}")
        adaptive = None
        cores, base = usable_cores(), torch.get_num_threads()
        if dev.type == "cpu" and automatic and cores > base:
            adaptive = AdaptiveThreads(base=base, wide=cores)
        args = (model, tokenizer, settings, name, is_random, folder, objective, trained_context, adaptive)
        return cls(*args, fast=dev.type == "cuda" if fast is None else fast, fast_compile=compile)

    def _banned_tokens(self) -> torch.Tensor:
        """Control tokens never belong on a canvas (pad and EOS do: they end the text), nor do ids the
        model has beyond the tokenizer's vocabulary."""
        tok = self.tokenizer
        banned = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        for i in range(tok.vocab_size):
            if tok.is_special(i) and i not in (tok.pad_id, tok.eos_id):
                banned[i] = True
        banned[tok.vocab_size :] = True
        return banned

    def _stop_tokens(self, stop: tuple[str, ...], heal: bytes) -> torch.Tensor | None:
        """[V] bool: tokens that hold one of the stop strings. The text is cut inside such a token, so it
        ends the fill as EOS does (the sampler may stop once the text up to it is settled). None when no
        stop string is given, or when token healing could put part of one in the first token's bytes (that
        text belongs to the prefix, not the fill). A stop string split over two tokens is not seen here;
        the text is still cut there afterwards."""
        needles = [s.encode("utf-8") for s in stop if s]
        if not needles or (heal and any(len(n) > 1 or n in heal for n in needles)):
            return None
        return self._stop_masks_for(tuple(stop))[0]

    def _stop_starts(self, stop: tuple[str, ...]) -> torch.Tensor | None:
        """[V] bool: the stop tokens that begin with one of the stop strings (a newline, a run of newlines):
        for the sampler's stop rules they end the text as EOS does, with nothing of their own."""
        return self._stop_masks_for(tuple(stop))[1]

    def _stop_masks_for(self, stop: tuple[str, ...]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(tokens holding a stop string, tokens beginning with one), built in one pass over the vocabulary
        and kept per stop tuple; None for a mask no token is in."""
        if stop not in self._stop_masks:
            needles = [s.encode("utf-8") for s in stop if s]
            table = self.tokenizer.bytes_table
            holds = [any(n in table[i] for n in needles) for i in range(len(table))]
            starts = [any(table[i].startswith(n) for n in needles) for i in range(len(table))]
            self._stop_masks[stop] = (self._vocab_mask(holds), self._vocab_mask(starts))
        return self._stop_masks[stop]

    def _vocab_mask(self, hits: list[bool]) -> torch.Tensor | None:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        mask[: len(hits)] = torch.tensor(hits, dtype=torch.bool)
        return mask if bool(mask.any()) else None

    # --- fill ---------------------------------------------------------------------------------

    @property
    def cache(self) -> ContextCache:
        """The "main" slot's cache (the one a request that names no slot uses)."""
        return self.cache_for("main")

    def cache_for(self, slot: str) -> ContextCache:
        if slot not in self.caches:
            if len(self.caches) >= MAX_CACHE_SLOTS:  # drop an idle one: each holds a whole context's keys
                idle = next((name for name in self.caches if name not in self._busy_slots), None)
                if idle is None:
                    raise EngineError(f"more than {MAX_CACHE_SLOTS} context cache slots in use at once")
                del self.caches[idle]
            runner = self.fast_backend() if self.fast else None  # the fast path encodes (FastBackend)
            self.caches[slot] = ContextCache(self.model, causal=self.objective == "causal", runner=runner)
        return self.caches[slot]

    def drop_idle_caches(self) -> None:
        """Forget every context cache no running fill reads (memory pressure); they refill on next use."""
        for slot in [name for name in self.caches if name not in self._busy_slots]:
            del self.caches[slot]

    def _thread_count(self):
        """A context giving the fill's CPU thread count (0 on a GPU), raised for it while the machine is quiet."""
        if self.threads is not None:
            return self.threads.applied()
        return nullcontext(torch.get_num_threads() if self.device.type == "cpu" else 0)

    def fill(self, request: FillRequest) -> FillResult:
        if request.candidates < 1:
            raise EngineError(f"candidates must be at least 1 (got {request.candidates})")
        if request.max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1 (got {request.max_tokens})")
        if request.settings.max_steps < 1:
            raise EngineError(f"max_steps must be at least 1 (got {request.settings.max_steps})")
        try:
            parse_rank(request.settings.rank)
        except ValueError as err:
            raise EngineError(str(err)) from None
        with self._lock:
            slot = request.cache_slot
            if slot in self._busy_slots:  # a nested fill would overwrite the context the outer one reads
                raise EngineError(f"context cache slot {slot!r} is in use by the fill this one runs inside")
            self._busy_slots.add(slot)
            try:
                return self._fill(request, self.cache_for(slot))
            finally:
                self._busy_slots.discard(slot)

    def _fill(self, request: FillRequest, cache: ContextCache) -> FillResult:
        with torch.inference_mode(), self._thread_count() as threads:
            start = time.perf_counter()
            plan = build_canvas(request, self.tokenizer, self.table, self.canvas_limit)
            if self.objective == "causal":
                return dataclasses.replace(self._fill_causal(request, plan, cache, start), threads=threads)
            # context tokens new to the cache (a draft also re-runs the last prefix token where the cache held it)
            encoded = len(plan.context_ids) - common_prefix_length(cache.ids, plan.context_ids)
            seed = None
            if request.settings.draft and not self.tokenizer.chat and draft.can_draft(plan, request):
                seed = draft.draft_canvas(cache, plan, request, self.banned, self.tokenizer)
                if request.candidates == 1:  # rows from noise keep the room the request asked for
                    plan, seed = draft.fit_canvas(plan, seed, self.tokenizer.eos_id, self.canvas_limit)
            cache.prepare(plan.context_ids)
            generator = torch.Generator(device=self.device)
            if request.seed is None:
                generator.seed()  # fresh entropy from the OS, never the global RNG
            else:
                generator.manual_seed(int(request.seed))

            candidates = [_Candidate() for _ in range(request.candidates)]
            self._denoise(plan, candidates, request, generator, cache, block=0, seed=seed)
            for cand in candidates:
                block = 1
                while plan.can_continue and not cand.ended and len(cand.block_ids) < request.max_tokens:
                    cache.prepare(plan.context_ids + cand.block_ids)  # this row's blocks, positions continue
                    length = bucket_length(request.max_tokens - len(cand.block_ids), self.canvas_limit)
                    self._denoise(continuation_plan(length), [cand], request, generator, cache, block=block)
                    block += 1

            if len(candidates) > 1 and request.settings.rank != "entropy" and not self.tokenizer.chat:
                self._score_likelihood(request, plan, candidates, cache)
                ranked = sorted(candidates, key=lambda c: -c.likelihood)
            else:
                ranked = sorted(candidates, key=lambda c: c.score)
            best = ranked[0]
            text, scores = assemble_text(best.tokens, self.tokenizer, plan.heal_bytes, best.logprobs)
            text = cut_at_stop(text, request.stop)
            alternatives: list[str] = []
            alternative_confidence = []
            for cand in ranked[1:]:
                alt, alt_scores = assemble_text(cand.tokens, self.tokenizer, plan.heal_bytes, cand.logprobs)
                alt = cut_at_stop(alt, request.stop)
                if alt != text and alt not in alternatives:
                    alternatives.append(alt)
                    alternative_confidence.append(confidence.summarize(alt, alt_scores))
            return FillResult(
                text=text,
                steps=best.steps,
                canvas_length=plan.length,
                tokens=best.committed,
                encoded_tokens=encoded,
                context_tokens=len(plan.context_ids),
                latency_ms=(time.perf_counter() - start) * 1000.0,
                stop_reason=best.stop_reason,
                blocks=best.blocks,
                token_scores=scores,
                alternatives=alternatives,
                threads=threads,
                confidence=confidence.summarize(text, scores),
                alternative_confidence=alternative_confidence,
            )

    def _denoiser(self, cache: ContextCache, length: int) -> sampler.Denoiser:
        """The decoder pass the sampler runs over `cache`'s context: the fast path's where it is on and the
        context fits its static cache, else the plain network's."""
        if self.fast:
            backend = self.fast_backend()
            if backend.fits(len(cache.ids), length):
                return backend.denoiser(cache)
        return lambda canvas, self_cond: self.model.denoise(canvas, cache.kv, self_cond)

    def fast_backend(self) -> FastBackend:
        if self._fast_backend is None:
            self._fast_backend = FastBackend(
                self.model, max_len=self.fast_max_len, bucket=self.fast_bucket, compile=self.fast_compile
            )
        return self._fast_backend

    def path_info(self) -> dict[str, object]:
        """Where fills denoise (dfim/stats): device, weights' dtype, what the fast path runs (None until the
        first fill builds it), and what reads the sampler's distributions (`triton_sampler`'s kernel or
        PyTorch; None until the first fill on a GPU checks the kernel)."""
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        fast = None if self._fast_backend is None else self._fast_backend.fast.describe()
        sampler = triton_sampler.describe(self.device.type)
        head = getattr(self.model, "head_packed", None)
        return {
            "device": str(self.device),
            "dtype": dtype,
            "fast": self.fast,
            "fast_path": fast,
            "sampler": sampler,
            # the CPU's products of a few rows: "int8" (an int8 checkpoint, where those are the faster),
            # "fp16" (fbgemm's copies) or "fp32"
            "cpu_products": (head.kind if head is not None else "fp32")
            if self.device.type == "cpu"
            else None,
        }

    def _score_likelihood(
        self, request: FillRequest, plan: CanvasPlan, candidates: list[_Candidate], cache: ContextCache
    ) -> None:
        """Each candidate's log-likelihood under the encoder's causal LM, as the prefix's continuation
        followed by the head of the suffix (which judges where the text ends). One batched causal pass
        over a view of the context cache cut before the last prefix token (whose logits predict the first
        new token); the cache itself is left as it is."""
        cache.prepare(plan.context_ids)  # a continued fill left its blocks there
        keep = len(plan.context_ids) - 2  # without <fim_middle>, and the last prefix token runs again
        after = request.suffix if request.scored_suffix is None else request.scored_suffix
        suffix_head = after[:SUFFIX_HEAD_CHARS]
        heal = plan.heal_bytes.decode("utf-8", errors="replace")
        rows: list[tuple[_Candidate, list[int]]] = []
        for cand in candidates:
            text, _ = assemble_text(cand.tokens, self.tokenizer, plan.heal_bytes)
            text = cut_at_stop(text, request.stop)
            ids = self.tokenizer.encode(heal + text + suffix_head)
            cand.likelihood = float("-inf")  # an empty fill shows nothing: ranked last
            if text.strip() and ids:
                rows.append((cand, ids))
        if not rows:
            return
        width = 1 + max(len(ids) for _, ids in rows)
        batch = torch.full((len(rows), width), self.tokenizer.pad_id, dtype=torch.long, device=self.device)
        batch[:, 0] = plan.context_ids[keep]
        for r, (_, ids) in enumerate(rows):
            batch[r, 1 : 1 + len(ids)] = torch.tensor(ids, dtype=torch.long, device=self.device)
        # right padding: a row's padding comes after its tokens, so no real token attends to it
        logits = self.model.context_lm(batch, cache.kv.shared_prefix(keep, len(rows)))[:, :-1]
        logp = torch.log_softmax(logits, dim=-1).gather(2, batch[:, 1:, None])[..., 0]  # [rows, width - 1]
        for r, (cand, ids) in enumerate(rows):
            cand.likelihood = float(logp[r, : len(ids)].sum())

    def _fill_causal(
        self, request: FillRequest, plan: CanvasPlan, cache: ContextCache, start: float
    ) -> FillResult:
        encoded = len(plan.context_ids) - common_prefix_length(cache.ids, plan.context_ids)
        out = autoregressive.decode(cache, plan, request, self.banned, self.tokenizer)
        # greedy decoding: a token's confidence is its plain probability, so its log is the token's log p
        logprobs = [math.log(max(conf, confidence.MIN_CONFIDENCE)) for _, conf, _ in out.tokens]
        text, scores = assemble_text(out.tokens, self.tokenizer, plan.heal_bytes, logprobs)
        text = cut_at_stop(text, request.stop)
        return FillResult(
            text=text,
            steps=out.steps,
            canvas_length=plan.length,
            tokens=len(out.tokens) + int(out.reason == "eos"),
            encoded_tokens=encoded,
            context_tokens=len(plan.context_ids),
            latency_ms=(time.perf_counter() - start) * 1000.0,
            stop_reason=out.reason,
            token_scores=scores,
            confidence=confidence.summarize(text, scores),
        )

    def _denoise(
        self,
        plan: CanvasPlan,
        candidates: list[_Candidate],
        request: FillRequest,
        generator: torch.Generator,
        cache: ContextCache,
        block: int,
        seed: draft.Draft | None = None,
    ) -> None:
        """Denoise one canvas for `candidates` (a batch over the cache's current context) and append
        the committed tokens to each. `seed`: the encoder's draft, the first candidate's start."""
        dev = self.device
        settings = request.settings
        warm = plan.warm_ids is not None
        init_ids = init_mask = None
        if warm:
            init_ids = torch.tensor(plan.warm_ids, dtype=torch.long, device=dev)
            init_mask = torch.tensor(plan.warm_mask, dtype=torch.bool, device=dev)
        elif seed is not None:
            init_ids = torch.tensor(seed.ids, dtype=torch.long, device=dev)[None]
            init_mask = torch.zeros((len(candidates), plan.length), dtype=torch.bool, device=dev)
            init_mask[0] = True
        heal = plan.heal_bytes if block == 0 else b""
        stop_tokens = self._stop_tokens(tuple(request.stop), heal)
        stop_starts = None if stop_tokens is None else self._stop_starts(tuple(request.stop))
        rules = plan_constraints(
            plan,
            self.banned,
            eos_id=self.tokenizer.eos_id,
            pad_id=self.tokenizer.pad_id,
            stop_tokens=stop_tokens,
            stop_starts=stop_starts,
        )
        state = sampler.new_state(
            len(candidates),
            rules,
            generator=generator,
            init_ids=init_ids,
            init_mask=init_mask,
            init_noise=request.warm_start_noise if warm else 0.0,
        )

        def report(
            step: int,
            entropy: float,
            ids: list[int],
            confidence: list[float],
            kept: list[bool],
            checks: dict[str, float] | None = None,
        ) -> None:
            assert request.on_step is not None
            positions, _ = middle_tokens(ids, plan.pinned, self.tokenizer.eos_id, self.tokenizer.pad_id)
            preview, _ = assemble_text([(ids[p], 1.0, False) for p in positions], self.tokenizer, heal)
            request.on_step(
                StepInfo(
                    step=step,
                    max_steps=settings.max_steps,
                    accepted=sum(kept),
                    canvas_length=plan.length,
                    mean_entropy=entropy,
                    argmax_text=preview,
                    block=block,
                    token_ids=ids,
                    tokens=[self.tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in ids],
                    confidence=confidence,
                    accepted_mask=kept,
                    pinned=list(plan.pinned),
                    heal=heal.decode("utf-8", errors="replace"),
                    checks=checks or {},
                )
            )

        def on_step(s: DenoiseState) -> None:
            if request.on_step is not None:
                ids = sampler.commit(s)[0].tolist()
                confidence = sampler.confidence(s)[0].tolist()
                checks = {name: float(value[0]) for name, value in s.checks.items()}
                report(
                    s.step, float(mean_free_entropy(s)[0]), ids, confidence, s.accepted[0].tolist(), checks
                )

        if seed is not None and request.on_step is not None:  # step 0: the draft, before any denoising
            report(0, 0.0, seed.ids, seed.confidence, [True] * plan.length)

        committed = sampler.run(
            state,
            build_chain(settings),
            self._denoiser(cache, plan.length),
            cancel=request.cancel,
            between_steps=request.between_steps,
            on_step=on_step,
        )
        conf = sampler.confidence(state).tolist()
        entropy = state.entropy.tolist()
        logprob = sampler.token_logprob(state, committed).tolist()
        if seed is not None:
            # The denoiser read the draft's tokens in its input, so its own distribution mostly echoes them
            # (log p ~ 0 whether the line is right or not). Where it kept a drafted token, that token's
            # likelihood is the encoder's, which wrote it without seeing it (FillConfidence).
            row = committed[0].tolist()
            for p, (drafted, seen) in enumerate(zip(seed.ids, seed.confidence, strict=True)):
                if seen > 0.0 and row[p] == drafted:
                    logprob[0][p] = math.log(seen)
        ends_text = stop_tokens.tolist() if stop_tokens is not None else None
        for b, cand in enumerate(candidates):
            ids = committed[b].tolist()
            positions, ended = middle_tokens(ids, plan.pinned, self.tokenizer.eos_id, self.tokenizer.pad_id)
            if ends_text is not None:  # the text is cut inside the first stop token: nothing after it counts
                stops = [i for i, p in enumerate(positions) if ends_text[ids[p]]]
                if stops:
                    positions, ended = positions[: stops[0] + 1], True
            cand.tokens += [(ids[p], conf[b][p], plan.pinned[p]) for p in positions]
            cand.logprobs += [logprob[b][p] for p in positions]
            cand.free_entropy += [entropy[b][p] for p in positions if not plan.pinned[p]]
            cand.block_ids += ids
            cand.committed += sum(1 for t in ids if t != self.tokenizer.pad_id)
            cand.steps += int(state.steps[b])
            cand.blocks += 1
            # Padding without an EOS also means the model is done: never feed pad to the encoder.
            cand.ended = ended or self.tokenizer.pad_id in ids or not plan.can_continue
            cand.stop_reason = state.stop_reason[b] or "max_steps"
