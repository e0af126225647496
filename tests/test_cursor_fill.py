"""A fill at a cursor outside the server (dfim.cursor_fill): the request it builds stops where the editor's
would."""

from __future__ import annotations

from dfim.cursor_fill import fill_request
from dfim.engine.api import SamplerSettings
from dfim.server.options import SamplingOptions


def test_a_line_stops_at_the_servers_inline_cap_and_several_lines_at_the_models():
    model = SamplerSettings(max_steps=48, entropy_bound=0.3)
    line = fill_request("x = ", "\n", model)
    assert line.settings.max_steps == SamplingOptions().max_steps == 8
    assert line.settings.entropy_bound == SamplingOptions().entropy_bound
    assert line.stop == ("\n",)
    assert fill_request("x = ", "\n", model, multiline=True).settings.max_steps == 48
    assert fill_request("x = ", "\n", model, steps=20).settings.max_steps == 20  # --steps wins
    assert (
        fill_request("x = ", "\n", SamplerSettings(max_steps=4)).settings.max_steps == 4
    )  # a lower cap stays
