"""Unit tests of server/options.py: merging and checking the client's settings."""

from __future__ import annotations

from dfim.server import options


def test_options_merge_camel_and_snake_case():
    merged, errors = options.merge_options(
        options.Options(), {"sampling": {"maxSteps": 8, "entropy_bound": 0.2}, "model": {"device": "cuda"}}
    )
    assert not errors
    assert (
        merged.sampling.max_steps == 8
        and merged.sampling.entropy_bound == 0.2
        and merged.model.device == "cuda"
    )


def test_bad_values_are_reported_and_previous_kept():
    previous, _ = options.merge_options(options.Options(), {"sampling": {"maxSteps": 8}})
    merged, errors = options.merge_options(
        previous,
        {
            "sampling": {"maxSteps": 0, "entropyBound": "high", "maxCanvas": 64},
            "model": {"device": "tpu"},
            "telemetry": {"enabled": "yes"},
            "languages": "python",
            "bogus": 1,
        },
    )
    assert merged.sampling.max_steps == 8 and merged.sampling.entropy_bound == 0.1
    assert merged.sampling.max_canvas == 64
    assert merged.model.device == "cpu" and merged.telemetry.enabled is True and merged.languages == ["*"]
    assert len(errors) == 6
    assert "unknown setting dfim.bogus (ignored)" in errors
    assert any("dfim.sampling.maxSteps" in e for e in errors)
    # non-finite numbers are refused; a message quotes what was sent, shortened
    merged, errors = options.merge_options(
        previous, {"sampling": {"entropyBound": float("nan"), "maxSteps": 1e300}}
    )
    assert merged.sampling.entropy_bound == 0.1 and merged.sampling.max_steps == 8
    assert len(errors) == 2 and "1e+300" in errors[1] and len(errors[1]) < 100
    merged, errors = options.merge_options(previous, {"sampling": {"entropyBound": 10**400, "seed": 10**400}})
    assert merged.sampling.entropy_bound == 0.1 and len(errors) == 2 and all(len(e) < 120 for e in errors)
    _, errors = options.merge_options(options.Options(), "not an object")
    assert errors
    # a Lua client's empty table arrives as []: no settings, no error (also nested)
    assert options.merge_options(previous, []) == (previous, [])
    assert options.merge_options(previous, {"sampling": []}) == (previous, [])
    _, errors = options.merge_options(previous, [1])
    assert errors


def test_options_json_round_trip():
    data = options.to_json(options.Options())
    merged, errors = options.merge_options(options.Options(), data)
    assert not errors and merged == options.Options()


def test_a_telemetry_dir_no_os_can_open_is_refused_and_the_previous_one_kept():
    """A NUL byte or a lone surrogate in telemetry.dataDir made every telemetry write raise ValueError: the
    setting was applied anyway, the change popped up "Error in server", and every inline request after it
    failed with an internal error."""
    before = options.merge_options(options.Options(), {"telemetry": {"dataDir": "/tmp/dfim-ok"}})[0]
    for bad in ("/tmp/a\x00b", "/tmp/\ud800x"):
        merged, errors = options.merge_options(before, {"telemetry": {"dataDir": bad}})
        assert merged.telemetry.data_dir == "/tmp/dfim-ok" and "NUL" in errors[0], errors
    # bytes that are not UTF-8 (os.fsdecode's escapes) still name a real directory
    assert options.merge_options(before, {"telemetry": {"dataDir": "/tmp/\udc80"}})[1] == []
    # a long non-object is quoted short in the popup
    assert len(options.merge_options(before, "x" * 100000)[1][0]) < 100


def test_a_whole_settings_tree_merges_onto_the_base_and_a_bad_value_keeps_the_one_in_use():
    base = options.Options()
    in_use, errors = options.merge_options(base, {"languages": ["go"], "sampling": {"maxSteps": 4}})
    assert errors == [] and in_use.languages == ["go"]
    # the client's whole tree again, without `languages` and with a bad maxSteps: languages goes back to
    # the base's, maxSteps stays at the value in use (not the base's 8), and the error says so
    merged, errors = options.merge_options(base, {"sampling": {"maxSteps": -1}}, keep=in_use)
    assert merged.languages == base.languages
    assert merged.sampling.max_steps == 4 and len(errors) == 1 and "maxSteps" in errors[0]
    assert options.merge_options(base, "nonsense", keep=in_use)[0] is in_use
