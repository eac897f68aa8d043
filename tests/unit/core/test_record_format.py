"""Record formats in the fold and the stored head (the rules are in docs/development.md, "Record
formats"). What each store does with a record of a newer format is in
``tests/stores/test_record_format.py``."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from pydantic import ValidationError

from orchestration.core.facts import AttemptStarted, RunCreated
from orchestration.core.fold import apply, head_from_creation
from orchestration.core.models import ChainStep, RunHead
from stores._common import encode_head
from stores._fs_files import head_position as _head_position
from tests.stores.builders import BASE_TIME, new_run, run_id, start_attempt


def test_the_head_keeps_the_highest_format_of_its_facts() -> None:
    head, facts = new_run(run_id(1))
    assert isinstance(facts[0], RunCreated)
    assert head.format == 1 == head_from_creation(facts[0]).format
    # A fact that needs a newer reader makes the head need one too, and later facts do not undo it.
    newer = AttemptStarted(
        seq=2, at=BASE_TIME + timedelta(seconds=1), task_id="architect", attempt=1, executor="x", format=2
    )
    head = apply(head, newer)
    assert head.format == 2
    assert apply(head, start_attempt(head).facts[0]).format == 2


def test_the_stored_head_states_its_format_and_keeps_its_prefix() -> None:
    head, _ = new_run(run_id(1))
    stored = encode_head(head)
    assert json.loads(stored)["format"] == 1
    assert RunHead.model_validate_json(stored) == head
    # The filesystem store's compare-and-swap reads run_id, version and last_seq from the start.
    assert _head_position(stored.encode()) == (head.run_id, head.version, head.last_seq)
    newer = head.model_copy(update={"format": 2})
    assert json.loads(encode_head(newer))["format"] == 2


def test_building_a_record_stays_strict() -> None:
    """Only stored records are read leniently: records built in code or from a caller's input
    (tool arguments, configuration) still refuse a field they do not have."""
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ChainStep.model_validate({"name": "a", "specialist": "writer", "aprove_before": True})
    head, _ = new_run(run_id(1))
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        RunHead.model_validate_json(head.model_dump_json()[:-1] + ',"lanes":[]}')
