"""Search error or model error? Beam search over the draft's decode, and rankers for its lines (session 18).

The shipped draft is greedy: the encoder, read as a causal LM, continues the prefix's text (`draft_from`
"prefix"; "middle" decodes after `<fim_middle>` instead) up to the line break. If many wrong lines were
search errors (a line the model itself prefers was missed), a beam would find them. For each HumanEval
problem this keeps the `--width` most likely distinct lines of a beam of that width (a line ends at its line
break or EOS), runs each against the problem's tests, and reports how many problems each ranker passes: the
beam's own score ("beam"), the same per token, the prefix continuation with the head of the suffix that the
engine ranks candidates by ("continuation"), their sum, and the denoiser's score of the line laid on the
canvas the engine would give it, without and with self-conditioning ("denoiser", "denoiser+sc"); "oracle"
counts problems where any kept line passes. `--width 1` is the plain greedy draft.

    python scripts/beam_rerank.py ../shared/data/humaneval-infilling/HumanEval-SingleLineInfilling.jsonl.gz \
        --limit 200 --width 4 [--decode prefix|middle]

Lines are taken raw (no denoising step, no server post-processing), so the greedy row reads a little below
the server's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dfim.engine import Engine
from dfim.engine.api import FillRequest
from dfim.engine.evaluation import sandbox
from dfim.engine.evaluation.fim import Problem, load_problems
from dfim.engine.inference.canvas import CanvasPlan, bucket_length, build_canvas
from dfim.engine.inference.fill import SUFFIX_HEAD_CHARS
from dfim.engine.model.kv_cache import KVCache

MAX_TOKENS = 32  # what the server asks for a line


@dataclass
class Line:
    text: str
    beam: float  # the beam's log-probability of the line (its tokens, and its line break or EOS)
    tokens: int
    continuation: float = 0.0
    denoiser: float = 0.0
    denoiser_sc: float = 0.0
    passed: bool = False


def beam_lines(
    engine: Engine, problem: Problem, width: int, decode: str
) -> tuple[list[Line], CanvasPlan, KVCache]:
    """The `width` most likely distinct lines of a beam over the draft's decode ("prefix": the prefix's text
    continued, as the shipped checkpoint drafts; "middle": after `<fim_middle>`), with the plan and a cache
    holding the whole FIM context (for the denoiser)."""
    tok, model = engine.tokenizer, engine.model
    plan = build_canvas(
        FillRequest(prefix=problem.prompt, suffix=problem.suffix, max_tokens=MAX_TOKENS),
        tok,
        engine.table,
        engine.canvas_limit,
    )
    heal = plan.heal_bytes.decode("utf-8", "replace")
    banned = engine.banned.clone()
    banned[tok.pad_id] = True
    first_banned = banned.clone()
    if plan.heal_allowed:  # token healing: the first token must start with the backed-off bytes
        allowed = torch.zeros_like(banned)
        allowed[plan.heal_allowed] = True
        first_banned |= ~allowed
    context = plan.context_ids if decode == "middle" else plan.context_ids[:-1]
    kv = model.new_cache()
    logits = model.context_lm(torch.tensor([context]), kv, last=1)[:, -1]
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    done: list[tuple[list[int], float]] = []
    for step in range(MAX_TOKENS):
        if step > 0:
            batch = torch.tensor([ids for ids, _ in beams])
            logits = model.context_lm(batch, kv.shared_prefix(len(context), len(beams)), last=1)[:, -1]
        mask = first_banned if step == 0 else banned
        logp = torch.log_softmax(logits.float().masked_fill(mask, float("-inf")), dim=-1)
        grown = []
        for row, (ids, score) in enumerate(beams):
            top = logp[row].topk(width)
            for value, token in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                if value > float("-inf"):  # fewer than `width` tokens allowed (healing): no banned ones
                    grown.append((ids + [token], score + value))
        grown.sort(key=lambda b: -b[1])
        beams = []
        for ids, score in grown:
            if ids[-1] == tok.eos_id:
                done.append((ids[:-1], score))
            elif "\n" in tok.decode(ids)[len(heal) :]:  # the line is written (the server's stop)
                done.append((ids, score))
            elif len(beams) < width:
                beams.append((ids, score))
        done.sort(key=lambda b: -b[1])
        # a live beam's score only falls: once `width` finished lines beat the best of them, they are final
        if not beams or (len(done) >= width and done[width - 1][1] >= beams[0][1]):
            beams = []
            break
    lines: dict[str, Line] = {}
    for ids, score in sorted(done + beams, key=lambda b: -b[1]):  # live beams: the token budget ran out
        text = tok.decode(ids)[len(heal) :].split("\n")[0]
        if text.strip() and text not in lines and len(lines) < width:
            lines[text] = Line(text, score, len(ids))
    if decode != "middle":  # the denoiser reads the whole FIM context
        model.context_lm(torch.tensor([plan.context_ids[-1:]]), kv, last=1)
    return list(lines.values()), plan, kv


def score_lines(engine: Engine, problem: Problem, plan: CanvasPlan, kv: KVCache, lines: list[Line]) -> None:
    """The continuation likelihood (as `Engine._score_likelihood` ranks candidates, over a view of the same
    cache) and the denoiser's."""
    tok, model = engine.tokenizer, engine.model
    heal = plan.heal_bytes.decode("utf-8", "replace")
    head = problem.suffix[:SUFFIX_HEAD_CHARS]
    keep = len(plan.context_ids) - 2  # without <fim_middle>, and the last prefix token runs again
    for line in lines:
        ids = tok.encode(heal + line.text + "\n" + head)
        batch = torch.tensor([[plan.context_ids[keep], *ids]])
        logp = torch.log_softmax(model.context_lm(batch, kv.shared_prefix(keep, 1))[0], -1)
        line.continuation = float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum())
    view = kv.shared_prefix(len(plan.context_ids), 1)
    for line in lines:  # each on the canvas the engine would give it (`draft.fit_canvas`)
        seq = tok.encode(heal + line.text + "\n") + [tok.eos_id]
        length = bucket_length(len(seq), engine.canvas_limit)
        canvas = torch.full((1, length), tok.pad_id)
        canvas[0, : min(len(seq), length)] = torch.tensor(seq[:length])
        first = model.denoise(canvas, view)
        second = model.denoise(canvas, view, first)
        for logits, field in ((first, "denoiser"), (second, "denoiser_sc")):
            logp = torch.log_softmax(logits.float(), -1).gather(2, canvas[..., None])[0, :, 0]
            setattr(line, field, float(logp[: min(len(seq), length)].sum()))


RANKERS: dict[str, Callable[[Line], float]] = {
    "beam": lambda x: x.beam,
    "beam/token": lambda x: x.beam / (x.tokens + 1),
    "continuation": lambda x: x.continuation,
    "beam+continuation": lambda x: x.beam + x.continuation,
    "denoiser": lambda x: x.denoiser,
    "denoiser+sc": lambda x: x.denoiser_sc,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", help="HumanEval infilling .jsonl[.gz]")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--decode", choices=("prefix", "middle"), help="where the draft starts (default: the checkpoint's)"
    )
    parser.add_argument("--out", default=None, help="write every line and its scores here (JSON lines)")
    args = parser.parse_args()
    engine = Engine.load(args.model, threads=1)
    decode = args.decode or engine.settings.draft_from
    passed = dict.fromkeys([*RANKERS, "oracle"], 0)
    out = open(args.out, "w") if args.out else None
    problems = load_problems(args.data, args.limit)
    with torch.inference_mode():
        for problem in problems:
            lines, plan, kv = beam_lines(engine, problem, args.width, decode)
            if not lines:
                continue
            score_lines(engine, problem, plan, kv, lines)
            for line in lines:
                program = sandbox.humaneval_program(
                    problem.prompt, line.text + "\n", problem.suffix, problem.test, problem.entry_point
                )
                line.passed = sandbox.run_program(program).passed
            for name, rank in RANKERS.items():
                passed[name] += max(lines, key=rank).passed
            passed["oracle"] += any(line.passed for line in lines)
            if out:
                out.write(json.dumps({"task_id": problem.task_id, "lines": [vars(x) for x in lines]}) + "\n")
    if out:
        out.close()
    n = len(problems)
    print(f"width {args.width}, draft from the {decode}, {n} problems: pass@1 by ranker")
    for name, count in passed.items():
        print(f"  {name:18s} {count:4d}  {100 * count / n:5.1f}%")


if __name__ == "__main__":
    main()
