"""Unit tests of server/chunk_ring.py: the ring of other files' chunks, its bound and its similarity eviction."""

from __future__ import annotations

from dfim.server.chunk_ring import ChunkRing, cut_chunk, line_set, similarity


def lines(prefix: str, n: int) -> str:
    return "".join(f"{prefix}_{i} = compute({i})\n" for i in range(n))


def test_similarity_is_dice_over_distinct_stripped_lines():
    a = line_set("x = 1\n    y = 2\n\nz = 3\n")
    b = line_set("x = 1\ny = 2\nw = 4\n")
    assert a == {"x = 1", "y = 2", "z = 3"}
    assert similarity(a, b) == 2 * 2 / (3 + 3)
    assert similarity(a, a) == 1.0
    assert similarity(a, frozenset()) == 0.0


def test_a_chunk_is_cut_around_its_line_and_kept_inside_the_file():
    text = lines("v", 200)
    chunk = cut_chunk("file:///a.py", text, 100, chunk_lines=64)
    assert chunk.first_line == 68 and chunk.text.count("\n") == 64
    assert chunk.text.split("\n")[chunk.center] == "v_100 = compute(100)"
    near_end = cut_chunk("file:///a.py", text, 199, chunk_lines=64)
    assert near_end.first_line == 136 and near_end.text.endswith("v_199 = compute(199)\n")
    assert cut_chunk("file:///a.py", "\n\nx\n\n", 1) is None  # too little to say


def test_the_ring_keeps_the_newest_chunks_up_to_its_capacity():
    ring = ChunkRing(capacity=3, chunk_lines=8)
    for i in range(5):
        ring.add_text(f"file:///f{i}.py", lines(f"f{i}", 8), 0)
    assert [c.uri for c in ring] == ["file:///f2.py", "file:///f3.py", "file:///f4.py"]
    assert ring.evicted == 0  # dropped for age, not for similarity


def test_a_new_chunk_evicts_older_ones_too_similar_to_it_and_keeps_the_rest():
    ring = ChunkRing(capacity=8, chunk_lines=20)
    base = lines("a", 20)
    ring.add_text("file:///a.py", base, 0)
    ring.add_text("file:///b.py", lines("b", 20), 0)
    # the same region of a.py after a one-line edit: 19 of 20 lines alike, the old chunk goes
    edited = base.replace("a_5 = compute(5)", "a_5 = compute(55)")
    ring.add_text("file:///a.py", edited, 0)
    assert [c.uri for c in ring] == ["file:///b.py", "file:///a.py"]
    assert ring.evicted == 1 and "compute(55)" in list(ring)[-1].text
    # half alike is not "too similar": both stay
    half = "".join(base.splitlines(True)[:10]) + lines("c", 10)
    ring.add_text("file:///c.py", half, 0)
    assert len(ring) == 3 and ring.evicted == 1


def test_pick_leaves_out_the_current_file_and_chunks_like_the_code_at_the_cursor():
    ring = ChunkRing(chunk_lines=16)
    ring.add_text("file:///a.py", lines("a", 16), 0)
    ring.add_text("file:///b.py", lines("b", 16), 0)
    ring.add_text("file:///c.py", lines("c", 16), 0)
    picked = ring.pick({"file:///c.py"}, local="unrelated = 1\n")
    assert [c.uri for c in picked] == ["file:///b.py", "file:///a.py"]  # newest first
    # the cursor's own code repeats a.py: the model reads it already
    picked = ring.pick({"file:///c.py"}, local=lines("a", 16))
    assert [c.uri for c in picked] == ["file:///b.py"]
