"""One model or a set: what each front end asks once, over the models.served setting."""

from __future__ import annotations

import pytest

from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.servedchoice import ModelSet, OneModel, served_choice

BOTH = ("smollm2", "smoke")


@pytest.mark.parametrize(
    ("options", "served", "expected"),
    [
        (ServeOptions(models=BOTH), (), ModelSet(ServeOptions(models=BOTH), BOTH)),
        (ServeOptions(models=BOTH), ("other",), ModelSet(ServeOptions(models=BOTH), BOTH)),
        (ServeOptions(), BOTH, ModelSet(ServeOptions(), BOTH)),
        (ServeOptions(preset="smoke"), BOTH, OneModel(ServeOptions(preset="smoke"))),
        (ServeOptions(model="a.gguf"), BOTH, OneModel(ServeOptions(model="a.gguf"))),
        (ServeOptions(), ("smoke",), OneModel(ServeOptions(model="smoke"))),
        (ServeOptions(preset="x"), ("smoke",), OneModel(ServeOptions(preset="x"))),
        (ServeOptions(), (), OneModel(ServeOptions())),
    ],
)
def test_the_choice_follows_the_flags_then_the_setting(options, served, expected):
    assert served_choice(options, Settings(models_served=served)) == expected
