"""Unit tests of server/app.py: which pushed settings are dfim's."""

from __future__ import annotations


def test_pushed_settings_are_dfims_only_where_they_say_so():
    from dfim.server.app import dfim_section

    ours = {"inline": {"enabled": False}}
    assert dfim_section({"dfim": ours, "pylsp": {}}) == ours
    assert dfim_section({"inline": {"enabled": False}}) == {"inline": {"enabled": False}}  # the section alone
    assert dfim_section({"maxSteps": 3, "sampling": {}}) == {"maxSteps": 3, "sampling": {}}  # ours, one typo
    assert dfim_section({"pylsp": {"plugins": {}}}) is None  # other servers' sections only: not ours
    assert dfim_section(None) is None and dfim_section({}) is None


def test_initialization_options_may_wrap_the_tree_in_a_dfim_key():
    from dfim.server.app import init_options_section

    ours = {"sampling": {"maxSteps": 4}}
    assert init_options_section({"dfim": ours}) == ours  # as `vim.lsp.config`'s `settings` holds it
    assert init_options_section({"dfim": ours, "token": "t"}) == {**ours, "token": "t"}  # --tcp's token stays
    assert init_options_section(ours) == ours and init_options_section(None) is None
