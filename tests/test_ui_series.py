"""The dashboard's charts' figures (``GET /api/series``): sampled by the app's lifespan
every few seconds into the last hour, from the database's figures, and stopped with it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import reactor
from reactor.ui import create_app
from tests._ui_support import TIMEOUT, start_cli, stop_cli
from tests.conftest import asgi_thread, wait_for

EVERY = 0.2  # seconds between samples here


def _series(url: str) -> Any:
    answer = httpx.get(url + "api/series", timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _sampled_after(url: str, when: float) -> Any:
    """The series once a sample taken after ``when`` (epoch seconds) is in."""
    return wait_for(lambda: (found := _series(url))["t"] and found["t"][-1] > when and found, 20)


def test_the_series_follow_writes_queues_subscribers_and_timers(db_path: Any) -> None:
    with reactor.open(db_path) as state, asgi_thread(create_app(state, sample_every=EVERY)) as url:
        first = _sampled_after(url, 0)
        assert first["interval"] == EVERY
        assert first["window"] == 3600
        assert first["writes"][0] is None  # no rate before a second sample
        mail = state.queue("mail")
        for n in range(5):
            mail.put(n)
        subscription = state.subscribe(lambda _event: None, durable="mailer", since=None)
        subscription.close()
        for n in range(3):
            state.scope("s").set(f"k{n}", n)  # the subscriber falls 3 behind
        state.scope("s").schedule("later", 1, after=3600)  # pending, not due: no lag
        written = time.time()
        found = _sampled_after(url, written)
        assert found["queues"]["mail"][-1] == 5
        assert found["lag"]["mailer"][-1] >= 3
        assert any(rate for rate in found["writes"] if rate), found["writes"]
        lengths = {len(found[name]) for name in ("t", "writes", "events", "timer_lag")}
        lengths |= {len(values) for values in found["queues"].values()}
        assert lengths == {len(found["t"])}
        assert all(lag >= 0 for lag in found["timer_lag"])


def test_the_sampler_stops_with_the_app(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        with asgi_thread(create_app(state, sample_every=EVERY)) as url:
            _sampled_after(url, 0)
        assert not [t.name for t in threading.enumerate() if t.name.startswith("reactor-aio")]
        state.scope("s").set("k", 1)  # the user's state is still open


def test_sample_every_must_be_above_zero(db_path: Any) -> None:
    with (
        reactor.open(db_path) as state,
        pytest.raises(reactor.InvalidArgumentError, match="sample_every"),
    ):
        create_app(state, sample_every=0)


def test_reactor_ui_samples_a_read_only_database_and_stops_on_ctrl_c(
    db_path: Any, tmp_path: Path
) -> None:
    with reactor.open(db_path) as state:
        state.queue("mail").put(1)
    process, url, _ = start_cli(db_path, cwd=tmp_path)  # read-only
    try:
        found = _sampled_after(url, 0)  # the first sample is taken as it starts
        assert found["interval"] == 5.0
        assert found["queues"]["mail"][-1] == 1
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err
    assert "Traceback" not in err
