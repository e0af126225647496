"""A fill-in-the-middle benchmark from real code: a Python project and its own test suite (issue 5, item 2).

    dfim bench-realcode build PROJECT --out problems.jsonl [--test-command "python -m unittest ..."]
    dfim bench-realcode score problems.jsonl (--reference | --completions FILE | --model PATH) [--out DIR]

`build`
1. runs the project's tests once, in the sandbox (dfim.engine.evaluation.sandbox) on a temporary copy, under a line tracer
   (`sys.settrace`, no coverage package) that records which lines of the project's own files ran; the suite
   must pass unmodified, or there is nothing to compare against;
2. parses every non-test source file with tree-sitter and takes four kinds of spans inside functions:
   `line` (one whole simple statement line), `block` (the body of a def/if/for/while/with/try clause, 2+
   lines), `condition` (of if/elif/while) and `call` (an outermost single-line call expression);
3. keeps only the spans the tests exercised: the span's line ran (for a block: every statement directly in
   it ran). `--mutation-check` also drops spans whose replacement by a wrong middle still passes the tests;
4. writes HumanEval-infilling-like JSONL: `task_id, prompt, suffix, canonical_solution` plus `kind, project,
   path, line, entry_point, test_command`. `prompt + canonical_solution + suffix` is the file as it is.

`score` writes `prompt + completion + suffix` over the file in a fresh copy of the project and runs the
project's test command in the sandbox: pass = exit status 0 within the limits. Also exact match and edit
similarity (dfim.engine.evaluation.metrics). Line and block middles are whole lines (indentation and newline included, as
in HumanEval-infilling); condition and call middles are the exact expression text.

The test command runs under `python -I -S` like every sandboxed program: the standard library only (so
`unittest`), unless `--site-packages` puts this interpreter's site-packages on the path (for pytest suites).

The modules, each imported by name (this package re-exports nothing):
- `tracing`: running the project's tests on a fresh copy in the sandbox, under the line tracer;
- `spans`: the tree-sitter span finder and what "exercised" means;
- `problems`: `build`, the problem records, and reading and writing problem and completion files;
- `scoring`: scoring completions by the tests, the summary table, and the engine's completions.
"""
