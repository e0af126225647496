"""Unit tests of server/engine_host.py: context budgets and urgent fills between a long fill's steps."""

from __future__ import annotations

import pytest


def test_shipped_model_declares_its_trained_context() -> None:
    import json

    from dfim.engine import Engine
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR
    from dfim.server.engine_host import EngineHost

    info = json.loads((DEFAULT_MODEL_DIR / "dfim.json").read_text())
    assert info["context_tokens"] == 1024 and info["objective"] == "diffusion"
    host = EngineHost()
    assert host.context_budget(1024, 256) == (1024, 256)  # nothing loaded yet: the options as set
    host.engine = Engine.load()
    assert host.engine.trained_context == 1024
    assert host.context_budget(1024, 256) == (764, 256)  # 1,020 tokens: the canvas's 4 specials aside
    host.engine = Engine.load(DEFAULT_MODEL_DIR.parent / "dfim-small")  # trained on 512
    assert host.context_budget(1024, 256) == (339, 169)


async def test_an_urgent_fill_runs_at_the_next_step_boundary_of_a_long_one(tmp_path) -> None:
    import asyncio
    import threading

    from dfim.engine import Engine, FillRequest, SamplerSettings
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint
    from dfim.server.engine_host import EngineHost

    host = EngineHost()
    host.engine = Engine.load(write_random_checkpoint(tmp_path, DEFAULT_MODEL_DIR / "tokenizer.json"))
    steps: list[int] = []
    long = FillRequest(
        prefix="def f(x):\n    return ",
        suffix="\n",
        max_tokens=16,
        settings=SamplerSettings(max_steps=200, entropy_bound=0.0),  # a random model never stops early
        on_step=lambda info: steps.append(info.step),
    )
    background = asyncio.ensure_future(host.fill(long, threading.Event()))
    while not steps:  # the long fill is in the engine
        await asyncio.sleep(0.005)
    quick = FillRequest(prefix="import os\n", suffix="", max_tokens=16, settings=SamplerSettings(max_steps=2))
    result = await host.fill(quick, threading.Event(), urgent=True)
    assert result.steps == 2 and not background.done()
    assert host.preempted == 1 and len(steps) < 200
    assert (await background).steps == 200
    assert quick.cache_slot != long.cache_slot
    host.shutdown()


def test_nested_urgent_fills_leave_the_action_a_step_and_never_move_the_model():
    from concurrent.futures import Future

    import torch

    from dfim.engine.api import EngineError, FillRequest
    from dfim.server.engine_host import EngineHost

    host = EngineHost()
    ran: list[str] = []

    def job(name: str, then=None):
        def run():
            ran.append(name)
            if then is not None:  # a keystroke arriving while this fill runs
                host._urgent.append((job(then), Future()))

        return run

    host._urgent.append((job("a", then="b"), Future()))
    host._run_urgent(nested=True)
    assert ran == ["a"] and len(host._urgent) == 1  # "b" waits for the action's next step
    host._run_urgent()
    assert ran == ["a", "b"] and not host._urgent  # on an idle worker, everything waiting runs
    for name in "cde":  # three documents waiting at once: the action steps between any two of them
        host._urgent.append((job(name), Future()))
    host._run_urgent(nested=True)
    assert ran[-1] == "c" and len(host._urgent) == 2
    host._run_urgent()
    assert ran[-2:] == ["d", "e"] and not host._urgent

    class OutOfMemoryOnGpu:  # a CUDA engine whose fills always run out of memory (no GPU here)
        device = torch.device("cuda")
        caches: dict = {}

        def fill(self, request):
            raise torch.OutOfMemoryError("injected")

        def drop_idle_caches(self):
            pass

    engine = OutOfMemoryOnGpu()
    host.engine = engine
    work: Future = Future()
    host._urgent.append((lambda: host._fill(engine, FillRequest(prefix="x", suffix="")), work))
    host._run_urgent(nested=True)
    with pytest.raises(EngineError, match="while a code action runs"):
        work.result()
    assert host.engine is engine and not host.fell_back_to_cpu  # no move to the CPU for good


async def test_urgent_fills_queue_one_drain_however_many_arrive(tmp_path) -> None:
    import asyncio
    import threading

    from dfim.engine import Engine, FillRequest, SamplerSettings
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint
    from dfim.server.engine_host import EngineHost

    host = EngineHost()
    host.engine = Engine.load(write_random_checkpoint(tmp_path, DEFAULT_MODEL_DIR / "tokenizer.json"))
    busy = threading.Event()
    host._executor.submit(busy.wait, 30)  # the worker is taken: everything else waits in its queue
    fills = [
        asyncio.ensure_future(
            host.fill(
                FillRequest(
                    prefix=f"x = {i}", suffix="", max_tokens=4, settings=SamplerSettings(max_steps=1)
                ),
                threading.Event(),
                urgent=True,
            )
        )
        for i in range(50)
    ]
    await asyncio.sleep(0.1)
    assert len(host._urgent) == 50 and host._executor._work_queue.qsize() == 1  # one drain, not 50
    busy.set()
    results = await asyncio.wait_for(asyncio.gather(*fills), 120)
    assert len(results) == 50 and not host._urgent
    host.shutdown()


def test_heap_usage_counts_a_live_buffer_and_forgets_it_once_freed() -> None:
    import platform

    from dfim.server.engine_host import heap_usage

    before = heap_usage()
    if before is None:
        libc, version = platform.libc_ver()
        assert libc != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 33), "mallinfo2 missing"
        pytest.skip("no mallinfo2 (not glibc, or glibc before 2.33)")
    assert set(before) == {"in_use", "free", "mmapped"} and all(v >= 0 for v in before.values())

    # 64 MiB is above glibc's default mmap threshold, so the buffer is usually an mmap of its own (`mmapped`);
    # after a process has tuned its allocator it may come from the heap instead (`in_use`): count both.
    # Other threads of the test process allocate too: the best of 3 tries.
    def live(usage: dict[str, float]) -> float:
        return usage["in_use"] + usage["mmapped"]

    seen = []
    for _ in range(3):
        start = heap_usage()
        block = bytearray(64 * 2**20)
        during = heap_usage()
        del block
        after = heap_usage()
        assert start is not None and during is not None and after is not None
        seen.append((live(during) - live(start), live(during) - live(after)))
        if seen[-1][0] >= 63 and seen[-1][1] >= 63:
            break
    assert any(grew >= 63 and freed >= 63 for grew, freed in seen), seen


@pytest.mark.parametrize("urgent", [True, False])
async def test_a_cancelled_fill_frees_its_memory_without_a_garbage_collection(tmp_path, urgent) -> None:
    # A cancelled fill's exception holds the engine's frames (logits, MBs). A reference cycle between the
    # exception and a frame holding its future kept them until a full collection, which a busy server runs
    # rarely: the soak's heap grew ~7 MB a minute. With the collector off, refcounting alone must free them.
    import asyncio
    import gc
    import threading
    import weakref

    from dfim.engine import Engine, FillRequest, SamplerSettings
    from dfim.engine.api import FillCancelled
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint
    from dfim.server.engine_host import EngineHost

    host = EngineHost()
    host.engine = Engine.load(write_random_checkpoint(tmp_path, DEFAULT_MODEL_DIR / "tokenizer.json"))
    refs = []
    gc.collect()
    gc.disable()
    try:
        for i in range(3):
            flag = threading.Event()
            steps: list[int] = []
            request = FillRequest(
                prefix=f"x = {i}\n",
                suffix="\n",
                max_tokens=16,
                settings=SamplerSettings(
                    max_steps=200, entropy_bound=0.0
                ),  # a random model never stops early
                on_step=lambda info, steps=steps: steps.append(info.step),
            )
            refs.append(weakref.ref(request))
            task = asyncio.ensure_future(host.fill(request, flag, urgent=urgent))
            while not steps:  # the fill is in the engine, its tensors in its frames
                await asyncio.sleep(0.005)
            flag.set()
            with pytest.raises(FillCancelled):
                await task
            del request, task
        await asyncio.sleep(0.05)  # the worker has left the last fill
        alive = [r for r in refs if r() is not None]
    finally:
        gc.enable()
        host.shutdown()
    assert not alive, f"{len(alive)} of 3 cancelled requests still alive without a garbage collection"


def test_path_info_is_the_engine_s_and_none_without_one(tmp_path) -> None:
    from dfim.engine import Engine
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint
    from dfim.server.engine_host import EngineHost

    host = EngineHost()
    assert host.path_info() is None  # nothing loaded (a served model has no path_info either)
    host.engine = Engine.load(write_random_checkpoint(tmp_path, DEFAULT_MODEL_DIR / "tokenizer.json"))
    assert host.path_info() == {
        "device": "cpu",
        "dtype": "float32",
        "fast": False,
        "fast_path": None,
        "sampler": "torch",
        "cpu_products": "fp32",  # a random fp32 checkpoint: no fp16 copies (they would round its weights)
    }
    host.shutdown()
