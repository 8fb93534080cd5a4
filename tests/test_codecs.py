"""Typed values (``reactor.codecs``): what a codec stores is plain JSON, what comes back
by type equals what went in, and a value the codec cannot take is refused before
anything is written.

Round trips go through the database under test (a SQLite file, or PostgreSQL with
``--backend=postgresql``); the plain JSON is read back by handles without a codec, by
another process (the command line) and by an export.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reactor
from reactor.codecs import Codec, TypedCodec
from reactor.testing import ManualClock

from .conftest import run_reactor, wait_for


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Customer(pydantic.BaseModel):
    name: str
    since: dt.date


@attrs.define
class Address:
    street: str
    city: str


class Line(msgspec.Struct):
    sku: str
    quantity: int


@dataclasses.dataclass
class Order:
    id: str
    placed: dt.datetime
    total: Decimal
    ref: uuid.UUID
    signature: bytes
    color: Color
    customer: Customer
    address: Address
    lines: list[Line]
    tags: tuple[str, ...] = ()
    due: dt.date | None = None
    wait: dt.timedelta = dt.timedelta(0)


def an_order(number: int = 1) -> Order:
    return Order(
        id=f"o-{number}",
        placed=dt.datetime(2026, 11, 29, 9, 30, 15, 123456, tzinfo=dt.UTC),
        total=Decimal("19.90"),  # the trailing zero is kept: stored as text
        ref=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        signature=b"\x00\xff\xfe binary",
        color=Color.BLUE,
        customer=Customer(name="Ann", since=dt.date(2020, 1, 2)),
        address=Address("1 Main St", "Springfield"),
        lines=[Line("apple", 3), Line("pear", 1)],
        tags=("gift", "express"),
        due=dt.date(2026, 12, 1),
        wait=dt.timedelta(hours=1, seconds=30),
    )


# What an_order() is as stored: plain JSON, readable without reactor's codec.
PLAIN_ORDER: dict[str, Any] = {
    "id": "o-1",
    "placed": "2026-11-29T09:30:15.123456Z",
    "total": "19.90",
    "ref": "12345678-1234-5678-1234-567812345678",
    "signature": "AP/+IGJpbmFyeQ==",
    "color": "blue",
    "customer": {"name": "Ann", "since": "2020-01-02"},
    "address": {"street": "1 Main St", "city": "Springfield"},
    "lines": [{"sku": "apple", "quantity": 3}, {"sku": "pear", "quantity": 1}],
    "tags": ["gift", "express"],
    "due": "2026-12-01",
    "wait": "PT3630S",
}


@pytest.fixture
def typed(open_state: Callable[..., reactor.State]) -> reactor.State:
    """A handle on the test's database with the typed codec."""
    return open_state(codec=TypedCodec())


# -- round trips through the database ---------------------------------------------------
def test_a_typed_value_is_stored_as_plain_json_and_comes_back_equal(
    typed: reactor.State, open_state: Callable[..., reactor.State]
) -> None:
    orders = typed.scope("orders")
    change = orders.set("o-1", an_order())
    assert change.new_value == PLAIN_ORDER
    assert orders.get("o-1") == PLAIN_ORDER  # without type=: what is stored
    assert orders.get("o-1", type=Order) == an_order()
    plain = open_state()  # a handle without a codec reads the same JSON
    assert plain.codec is None
    assert plain.scope("orders").get("o-1") == PLAIN_ORDER
    assert plain.scope("orders").get("o-1", type=Order) == an_order()  # decodes all the same


@pytest.mark.parametrize(
    ("value", "stored", "kind"),
    [
        (dt.datetime(2026, 3, 29, 1, 30), "2026-03-29T01:30:00", dt.datetime),
        (
            dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            "2026-03-29T01:30:00+02:00",
            dt.datetime,
        ),
        (dt.date(1999, 12, 31), "1999-12-31", dt.date),
        (dt.time(23, 59, 59, 999999), "23:59:59.999999", dt.time),
        (dt.timedelta(days=-1, seconds=5), "-PT86395S", dt.timedelta),
        (Decimal("0.1000000000000000000000000001"), "0.1000000000000000000000000001", Decimal),
        (Decimal("-1E+30"), "-1E+30", Decimal),
        (uuid.UUID(int=0), "00000000-0000-0000-0000-000000000000", uuid.UUID),
        (b"", "", bytes),
        (bytes(range(256)), None, bytes),
        (Color.RED, "red", Color),
        ((1, 2, 3), [1, 2, 3], tuple[int, ...]),
        (frozenset({"a"}), ["a"], frozenset[str]),
        ({"when": dt.date(2020, 2, 29)}, {"when": "2020-02-29"}, dict[str, dt.date]),
    ],
    ids=repr,
)
def test_each_ready_type_round_trips(
    typed: reactor.State, value: Any, stored: Any, kind: Any
) -> None:
    scope = typed.scope("values")
    scope.set("k", value)
    if stored is not None:
        assert scope.get("k") == stored
    back = scope.get("k", type=kind)
    assert back == value
    assert type(back) is type(value)


def test_a_value_of_plain_json_is_stored_as_it_is(typed: reactor.State) -> None:
    scope = typed.scope("values")
    value = {"a": [1, 2.5, "x", None, True, {"b": []}]}
    assert scope.set("k", value).new_value == value
    assert scope.get("k", type=dict[str, list[Any]]) == value


def test_a_list_of_typed_values_round_trips(typed: reactor.State) -> None:
    orders = typed.scope("orders")
    orders.set("all", [an_order(1), an_order(2)])
    assert orders.get("all", type=list[Order]) == [an_order(1), an_order(2)]


MOMENTS = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)
)


@dataclasses.dataclass
class Sample:
    moment: dt.datetime
    amount: Decimal
    ref: uuid.UUID
    data: bytes
    day: dt.date
    texts: list[str]


@given(
    sample=st.builds(
        Sample,
        moment=MOMENTS,
        amount=st.decimals(allow_nan=False, allow_infinity=False),
        ref=st.uuids(),
        data=st.binary(max_size=64),
        day=st.dates(),
        texts=st.lists(st.text(max_size=8), max_size=4),
    )
)
@settings(max_examples=60, deadline=None)
def test_any_sample_round_trips_through_memory(sample: Sample) -> None:
    with reactor.open(":memory:", codec=TypedCodec()) as state:
        scope = state.scope("samples")
        scope.set("s", sample)
        back = scope.get("s", type=Sample)
    assert back == sample
    assert str(back.amount) == str(sample.amount)  # the same digits, not only equal


# -- where a codec applies --------------------------------------------------------------
def test_every_verb_that_takes_a_value_goes_through_the_codec(typed: reactor.State) -> None:
    scope = typed.scope("verbs")
    day = dt.date(2026, 1, 1)
    scope.set_many({"a": day, "b": Decimal("1.50")})
    assert scope.get_many(["a", "b"]) == {"a": "2026-01-01", "b": "1.50"}
    assert scope.get_many(["a"], type=dt.date) == {"a": day}
    assert scope.push("list", day, uuid.UUID(int=1)) == 2
    assert scope.get("list") == ["2026-01-01", "00000000-0000-0000-0000-000000000001"]
    result = scope.update("a", [{"type": "set", "path": "", "value": {"at": day}}])
    assert result.new_value == {"at": "2026-01-01"}
    patched = scope.update("a", [{"op": "replace", "path": "/at", "value": dt.date(2027, 1, 1)}])
    assert patched.new_value == {"at": "2027-01-01"}
    # compare_and_swap compares what the expected value would be stored as.
    assert scope.compare_and_swap("b", Decimal("1.50"), Decimal("2.00")) is True
    assert scope.compare_and_swap("b", Decimal("1.5"), Decimal("3")) is False  # "1.5" != "2.00"
    assert scope.get("b", type=Decimal) == Decimal("2.00")
    assert scope.compare_and_swap("c", reactor.MISSING, day) is True
    assert scope.get("c", type=dt.date) == day
    assert scope.list(type=Any)["c"] == "2026-01-01"


def test_a_timer_writes_the_value_as_the_codec_stored_it(
    open_state: Callable[..., reactor.State], clock: ManualClock
) -> None:
    state = open_state(codec=TypedCodec(), clock=clock)
    scope = state.scope("timers")
    scope.schedule("due", an_order(), after=1.0)
    seen = threading.Event()
    state.subscribe(lambda _event: seen.set(), scope="timers", key="due")
    clock.advance(2.0)
    assert seen.wait(10)
    assert scope.get("due") == PLAIN_ORDER


def test_transactions_and_queues_use_the_handles_codec(typed: reactor.State) -> None:
    with typed.scope("orders").transaction() as tx:
        tx.set("o-1", an_order())
    with typed.transaction("orders", "audit") as multi:
        multi["audit"].set("o-1", {"at": dt.date(2026, 1, 1)})
        multi.enqueue("shipping", an_order())
    assert typed.scope("orders").get("o-1", type=Order) == an_order()
    assert typed.scope("audit").get("o-1") == {"at": "2026-01-01"}
    queue = typed.queue("shipping")
    queue.put(an_order(2))
    first, second = queue.take(timeout=5), queue.take(timeout=5)
    assert first is not None
    assert second is not None
    assert first.item == PLAIN_ORDER
    assert TypedCodec().decode(second.item, Order) == an_order(2)


def test_a_scopes_codec_takes_the_place_of_the_states(
    open_state: Callable[..., reactor.State],
) -> None:
    plain = open_state()
    with pytest.raises(reactor.InvalidValueError, match=r"codec=reactor\.codecs\.TypedCodec"):
        plain.scope("orders").set("o-1", an_order())
    typed_scope = plain.scope("orders", codec=TypedCodec())
    typed_scope.set("o-1", an_order())
    with typed_scope.transaction() as tx:
        tx.set("o-2", an_order(2))
    assert plain.scope("orders").get("o-2", type=Order) == an_order(2)
    # And a scope can be strict on a typed handle: a codec that refuses everything.
    strict = open_state(codec=TypedCodec()).scope("orders", codec=Refusing())
    with pytest.raises(reactor.InvalidValueError, match="refused"):
        strict.set("o-3", 1)


class Refusing:
    """A codec of one's own: refuses every value."""

    def encode(self, value: Any) -> Any:
        raise reactor.InvalidValueError(f"refused {value!r}")

    def decode(self, value: Any, type: Any) -> Any:  # noqa: A002 - the protocol's name
        return value


def test_a_codec_of_ones_own_is_any_object_with_the_two_methods(
    open_state: Callable[..., reactor.State],
) -> None:
    @dataclasses.dataclass(frozen=True)
    class Point:
        x: int
        y: int

    class PointsAsPairs:
        def encode(self, value: Any) -> Any:
            return [value.x, value.y] if isinstance(value, Point) else value

        def decode(self, value: Any, type: Any) -> Any:  # noqa: A002
            return type(*value)

    assert isinstance(PointsAsPairs(), Codec)
    state = open_state(codec=PointsAsPairs())
    state.scope("points").set("p", Point(1, 2))
    assert state.scope("points").get("p") == [1, 2]
    assert state.scope("points").get("p", type=Point) == Point(1, 2)


def test_encoders_and_decoders_of_ones_own_types(open_state: Callable[..., reactor.State]) -> None:
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Money) and other.cents == self.cents

        __hash__ = None  # type: ignore[assignment]

    class Euros(Money):
        pass

    codec = TypedCodec(
        encoders={Money: lambda money: f"{money.cents / 100:.2f}"},
        decoders={Money: lambda text: Money(round(float(text) * 100))},
    )
    assert "Money" in repr(codec)
    state = open_state(codec=codec)
    wallet = state.scope("wallet")
    wallet.set("cash", {"total": Euros(1234)})  # a subclass finds its base's encoder
    assert wallet.get("cash") == {"total": "12.34"}
    assert wallet.get("cash", type=dict[str, Money]) == {"total": Money(1234)}


# -- refused before anything is written -------------------------------------------------
class Unknown:
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Unknown(), "Unknown is not a JSON type, and this codec has no encoder for it"),
        ({"a": [1, Unknown()]}, "no encoder"),
        ({1: dt.date(2020, 1, 1)}, "dict keys must be str"),
        ({"x": float("nan")}, "not a JSON number"),
        (2**70, "64"),
        ("\ud800", "surrogate"),
    ],
    ids=["object", "nested object", "int key", "nan", "big int", "lone surrogate"],
)
def test_a_value_the_codec_cannot_store_is_refused_and_nothing_is_written(
    typed: reactor.State, value: Any, message: str
) -> None:
    scope = typed.scope("refused")
    events: list[Any] = []
    typed.subscribe(events.append, scope="refused")
    with pytest.raises(reactor.InvalidValueError, match=message):
        scope.set("k", value)
    with pytest.raises(reactor.InvalidValueError):
        typed.queue("refused").put(value)
    scope.set("marker", 1)  # events arrive in order: the marker's is the only one
    wait_for(lambda: len(events) >= 1, timeout=10)
    assert [event.key for event in events] == ["marker"]
    assert scope.keys() == ["marker"]
    assert typed.queue("refused").stats()["ready"] == 0


def test_a_cycle_is_refused(typed: reactor.State) -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(reactor.InvalidValueError):
        typed.scope("refused").set("k", looped)


def test_an_encoder_that_raises_is_a_typed_error(open_state: Callable[..., reactor.State]) -> None:
    def broken(_value: Unknown) -> Any:
        raise KeyError("boom")

    state = open_state(codec=TypedCodec(encoders={Unknown: broken}))
    with pytest.raises(reactor.InvalidValueError, match="boom") as caught:
        state.scope("s").set("k", Unknown())
    assert isinstance(caught.value.__cause__, KeyError)
    assert state.scope("s").keys() == []


def test_a_value_that_does_not_fit_the_type_is_a_typed_error_naming_the_key(
    typed: reactor.State,
) -> None:
    scope = typed.scope("orders")
    scope.set("o-1", {"id": 1})
    with pytest.raises(reactor.TypeMismatchError, match=r"'o-1' in scope 'orders'.*Order"):
        scope.get("o-1", type=Order)
    with pytest.raises(reactor.TypeMismatchError, match="Decimal"):
        scope.get("o-1", type=Decimal)
    with pytest.raises(reactor.TypeMismatchError):
        scope.get_many(["o-1"], type=Order)
    with pytest.raises(reactor.TypeMismatchError, match="Customer"):
        scope.get("o-1", type=Customer)  # pydantic's own validation error, typed
    assert scope.get("absent", "fallback", type=Order) == "fallback"  # returned as given


def test_a_decoder_that_raises_is_a_typed_error(open_state: Callable[..., reactor.State]) -> None:
    def broken(_value: Any) -> Unknown:
        raise KeyError("boom")

    state = open_state(codec=TypedCodec(decoders={Unknown: broken}))
    state.scope("s").set("k", 1)
    with pytest.raises(reactor.TypeMismatchError, match="boom"):
        state.scope("s").get("k", type=Unknown)


@pytest.mark.parametrize(
    "arguments",
    [{"encoders": [Unknown]}, {"encoders": {Unknown: 1}}, {"decoders": {"Unknown": str}}],
    ids=repr,
)
def test_bad_hooks_are_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(reactor.InvalidArgumentError):
        TypedCodec(**arguments)


def test_a_codec_without_its_methods_is_refused(open_state: Callable[..., reactor.State]) -> None:
    with pytest.raises(reactor.InvalidArgumentError, match="codec must have"):
        open_state(codec=object())
    state = open_state()
    with pytest.raises(reactor.InvalidArgumentError, match="codec must have"):
        state.scope("s", codec="json")  # type: ignore[arg-type]


# -- asyncio ------------------------------------------------------------------------------
def test_asyncio_handles_take_the_codec_too(db_path: Any) -> None:
    async def main() -> tuple[Any, Any, Any]:
        async with reactor.aio.open(db_path, codec=TypedCodec()) as state:
            orders = state.scope("orders")
            await orders.set("o-1", an_order())
            async with orders.transaction() as tx:
                await tx.set("o-2", an_order(2))
            own = state.scope("days", codec=TypedCodec())
            await own.set("d", dt.date(2026, 1, 1))
            return (
                await orders.get("o-1", type=Order),
                await orders.get_many(["o-2"], type=Order),
                await own.list(type=dt.date),
            )

    one, many, days = asyncio.run(main())
    assert one == an_order()
    assert many == {"o-2": an_order(2)}
    assert days == {"d": dt.date(2026, 1, 1)}


# -- the plain JSON elsewhere: the command line, an export, start-up -----------------------
def test_the_command_line_export_and_import_carry_plain_json(
    typed: reactor.State,
    db_path: Any,
    fresh_db: Any,
    tmp_path: Path,
    open_state: Callable[..., reactor.State],
) -> None:
    typed.scope("orders").set("o-1", an_order())
    typed.queue("shipping").put(an_order(2))
    shown = run_reactor("--db", str(db_path), "get", "orders", "o-1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == PLAIN_ORDER
    exported = run_reactor("--db", str(db_path), "export", "out.jsonl", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    values = [line["value"] for line in lines if line.get("key") == "o-1"]
    assert values == [PLAIN_ORDER]
    imported = run_reactor("--db", str(fresh_db), "import", "out.jsonl", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    copy = open_state(fresh_db)
    assert copy.scope("orders").get("o-1", type=Order) == an_order()
    job = copy.queue("shipping").take(timeout=5)
    assert job is not None
    assert TypedCodec().decode(job.item, Order) == an_order(2)


def test_msgspec_is_imported_only_when_a_codec_is_used(tmp_path: Path) -> None:
    program = (
        "import sys, reactor\n"
        "with reactor.open(':memory:') as state:\n"
        "    state.scope('s').set('k', {'a': 1})\n"
        "    assert state.scope('s').get('k') == {'a': 1}\n"
        "assert 'msgspec' not in sys.modules, 'imported too soon'\n"
        "from reactor.codecs import TypedCodec\n"
        "assert 'msgspec' not in sys.modules, 'imported with the module'\n"
        "with reactor.open(':memory:', codec=TypedCodec()) as state:\n"
        "    state.scope('s').set('k', b'x')\n"
        "assert 'msgspec' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
