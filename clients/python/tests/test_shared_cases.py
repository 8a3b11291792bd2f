"""The tables of cases in the repository's ``testdata/`` that the Rust crates' tests hold their
own code to (the reference), checked here against this package's: the resource text form, the
event stream's reader, and the rule that picks among pool offers. The dashboard's scripts are
checked against the same tables in ``test_dashboard.py``."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional

import pytest

from allot import Client
from allot._resources import ResourcesError, amount_to_take, format_resources, parse_resources, pick_offers
from allot._sse import EventStream

from .conftest import REPO, Daemon


def table(name: str) -> Dict[str, Any]:
    loaded: Dict[str, Any] = json.loads((REPO / "testdata" / name).read_text())
    return loaded


def test_the_text_form_reads_as_the_shared_table_says() -> None:
    cases = table("resources.json")["cases"]
    assert len(cases) > 40
    for case in cases:
        text = case["text"]
        if "error" in case:
            with pytest.raises(ResourcesError) as refused:
                parse_resources(text)
            assert refused.value.kind == case["error"], text
            continue
        parsed = parse_resources(text)
        assert parsed == case["milli"], text
        assert parse_resources(format_resources(parsed)) == parsed, "what it writes reads back"


def messages_of(chunks: List[str]) -> List[Dict[str, Optional[str]]]:
    stream = EventStream()
    got: List[Dict[str, Optional[str]]] = []
    for chunk in chunks:
        got.extend({"id": m.id, "event": m.event, "data": m.data} for m in stream.feed(chunk.encode()))
    return got


def test_the_event_stream_reads_as_the_shared_table_says() -> None:
    cases = table("sse.json")["cases"]
    assert len(cases) > 10
    for case in cases:
        want = [{"id": None, "event": None, "data": None, **m} for m in case["messages"]]
        text = "".join(case["chunks"])
        # As the table cuts it, whole, and a byte at a time.
        assert messages_of(case["chunks"]) == want, case["why"]
        assert messages_of([text]) == want, case["why"]
        assert messages_of(list(text)) == want, case["why"]


def test_offers_are_picked_as_the_shared_table_says() -> None:
    cases = table("offer_picks.json")["cases"]
    assert len(cases) > 10
    for case in cases:
        wanted = parse_resources(case["min"])
        most = parse_resources(case["max"]) if "max" in case else wanted
        offers = [(i, parse_resources(text)) for i, text in enumerate(case["offers"])]
        picks = pick_offers(offers, wanted, most)
        assert [i for i, _ in picks] == case["picks"], case["why"]
        takes = [amount_to_take(available, wanted, most) for _, available in picks]
        assert takes == [parse_resources(text) for text in case["takes"]], case["why"]


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.url) as c:
        yield c


def test_alloc_picks_the_pool_the_shared_scenario_names(client: Client) -> None:
    """The scenario the Rust client's ``allocate`` runs too (allot-client's tests)."""
    scenario = table("offer_picks.json")["daemon"]
    prefix = "shared-"
    for name, capacity in scenario["pools"].items():
        client.put_pool(prefix + name, capacity)
    try:
        with client.hold_alloc([prefix + name for name in scenario["pools"]], min_resources=scenario["min"]) as alloc:
            assert alloc["pool"] == prefix + scenario["pool"], scenario["why"]
            assert alloc["resources"] == scenario["resources"]
    finally:
        for name in scenario["pools"]:
            client.remove_pool(prefix + name, force=True)
