"""The fold's table of handlers (``orchestration.core.fold._HANDLERS``): every fact type after
``run_created`` has its handler, found by the fact's type, and each handler is written for the fact
type it is filed under. A fact type added to the union without a handler, or a handler filed under
the wrong type, fails here before any run reaches it."""

from __future__ import annotations

import inspect
from typing import get_args, get_type_hints

from orchestration.core.facts import Fact, RunCreated
from orchestration.core.fold import _HANDLERS


def test_every_fact_after_run_created_has_a_handler() -> None:
    members = set(get_args(get_args(Fact)[0]))
    assert set(_HANDLERS) == members - {RunCreated}


def test_each_handler_takes_the_fact_type_it_is_filed_under() -> None:
    for kind, handler in _HANDLERS.items():
        fact_param = list(inspect.signature(handler).parameters)[1]
        assert get_type_hints(handler)[fact_param] is kind, handler.__name__
