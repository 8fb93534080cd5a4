"""``reactor bench``, run as a user would: smoke runs, figures only checked for shape
(never for speed), tables checked to fit 80 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

VERBS = ("set", "get", "update", "increment", "delete")
REQUIRED = ("reactor", "dict+lock", "sqlite3", "sqlite3+log", "diskcache")
QUICK_WRITERS = ("1", "2")  # what --quick measures, in threads and in processes


def bench(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m reactor ARGS`` with stdout piped and an 80-column terminal's COLUMNS."""
    environment = {**os.environ, "COLUMNS": "80"}
    environment.pop("REACTOR_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "reactor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=environment,
    )


def too_wide(lines: list[str]) -> list[str]:
    return [line for line in lines if len(line) > 80]


def assert_scaling(result: dict[str, Any], backend: str) -> dict[str, Any]:
    """The writers section of a quick run: every writer count, both layouts."""
    section = result["scaling"][backend]
    assert "error" not in section, section["error"]
    for kind in ("threads", "processes"):
        for layout in ("own_scope", "one_scope"):
            for count in QUICK_WRITERS:
                entry = section[kind][layout][count]
                assert entry["writes_per_s"] > 0, (kind, layout, count)
                assert entry["writers"] == int(count)
                assert entry["vs_one_writer"] is not None
    assert section["threads"]["own_scope"]["1"]["vs_one_writer"] == 1.0
    assert section["settings"]["rounds"] == 1
    assert section["targets"], "each backend has its targets"
    return section


def assert_workflow(result: dict[str, Any]) -> None:
    """The workflow section: every probe timer fired, every queue did each job once."""
    section = result["workflow"]
    assert section["errors"] == {}
    timers = section["timers"]
    assert timers["fired"] == timers["probes"] > 0
    assert timers["pending_after"] == timers["pending"], "the far timers stay pending"
    assert 0 <= timers["lag_p50_ms"] <= timers["lag_max_ms"]
    assert "huey" not in section["queue_skipped"]  # the bench extra installs it
    for peer in ("reactor", "huey", "sqlite3"):
        for workers in ("1", "4", "4p"):  # threads, then processes
            found = section["queue"][peer][workers]
            assert found["exactly_once"] is True, (peer, workers, found)
            assert found["take_ack_per_s"] > 0
            assert found["error"] is None
    if "redis" not in section["queue_skipped"]:  # RQ's own worker processes, on Redis
        assert "rq" not in section["queue_skipped"]  # the bench extra installs it
        rq = section["queue"]["rq"]
        assert list(rq) == ["4p"]
        assert rq["4p"]["exactly_once"] is True, rq
    latency = section["latency"]["reactor"]  # a worker process woken by each put
    assert latency["samples"] == 20
    assert 0 < latency["p50_ms"] <= latency["p99_ms"]
    assert latency["error"] is None


def assert_durable(result: dict[str, Any], backend: str) -> None:
    """The durable-workflow section: every cell of reactor (and of DBOS when installed)
    measured, every result right, a step's record one commit, the targets there."""
    section = result["durable"]
    peers = ["reactor"] if "dbos" in section["skipped"] else ["reactor", "dbos"]
    assert sorted(section["figures"]) == sorted(peers), section["skipped"]
    for peer in peers:
        for cell in ("1p", "4p"):
            found = section["figures"][peer][cell]
            assert found["error"] is None, (peer, cell, found["error"])
            assert found["correct"] is True, (peer, cell)
            assert found["per_s"] > 0
        steps = section["figures"][peer]["steps"]
        assert steps["error"] is None, (peer, steps["error"])
        assert steps["correct"] is True
        assert steps["step_us"] is not None
    reactor = section["figures"]["reactor"]
    assert 0.9 <= reactor["steps"]["commits_per_step"] <= 1.1, "one commit per recorded step"
    # Its start and its take alone; its claim, 3 steps and end, 5 records, may share
    # commits with other runs' records (4 worker threads): from 7 down to 2 and a bit.
    assert 2 <= reactor["1p"]["commits_per_workflow"] <= 7.5
    texts = [target["text"] for target in section["targets"]]
    assert texts[-1] == "a recorded step: one commit"
    assert len(texts) == (3 if backend == "sqlite" else 2)
    if "dbos" in peers:
        assert all(section["ratios"][cell] is not None for cell in ("1p", "4p", "steps"))
    else:
        assert section["skipped"]["dbos"].startswith("not installed")


@pytest.mark.timeout(170)
def test_bench_durable_alone(tmp_path: Path) -> None:
    """reactor against DBOS (skipped with a reason where DBOS is not installed), in
    tables that fit 80 columns, and the JSON beside them."""
    done = bench(
        "bench",
        "--quick",
        "--only",
        "durable",
        "--table",
        "-o",
        "out.json",
        cwd=tmp_path,
        timeout=160,
    )
    assert done.returncode == 0, done.stderr
    assert too_wide(done.stdout.splitlines()) == []
    assert "durable workflows, reactor and DBOS on SQLite" in " ".join(done.stdout.split())
    result = json.loads((tmp_path / "out.json").read_text())
    assert "workflow" not in result
    assert_durable(result, "sqlite")


def assert_derived(result: dict[str, Any]) -> None:
    """The derived-values section: both latencies and both rates measured, no value
    computed by the writes none reads, the four targets there (met or not: a shared
    machine's p99 is its own)."""
    section = result["derived"]
    assert section.get("error") is None, section["error"]
    for key in ("in_process", "across"):
        found = section[key]
        assert found.get("error") is None, found["error"]
        assert 0 < found["p50_ms"] <= found["p99_ms"]
    assert section["in_process"]["count"] == section["settings"]["count"]
    assert section["across"]["count"] >= 1
    many = section["many"]
    assert many.get("error") is None, many["error"]
    assert many["writes_per_s_none"] > 0
    assert many["writes_per_s_live"] > 0
    assert many["recomputations"] == 0
    assert [target["ok"] is not None for target in section["targets"]] == [True] * 4


def test_bench_derived_alone(tmp_path: Path) -> None:
    done = bench(
        "bench",
        "--quick",
        "--only",
        "derived",
        "--table",
        "-o",
        "out.json",
        cwd=tmp_path,
        timeout=160,
    )
    assert done.returncode == 0, done.stderr
    assert too_wide(done.stdout.splitlines()) == []
    assert "derived values on SQLite" in " ".join(done.stdout.split())
    result = json.loads((tmp_path / "out.json").read_text())
    assert "durable" not in result
    assert_derived(result)


def test_bench_startup_alone(tmp_path: Path) -> None:
    """The start-up section runs each command from the shell and gives each a time and
    a ratio to a bare interpreter (whose own ratio is 1); no time is asserted."""
    done = bench("bench", "--quick", "--only", "startup", "--table", "-o", "out.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert too_wide(done.stdout.splitlines()) == []
    assert "start-up from the shell" in " ".join(done.stdout.split())
    section = json.loads((tmp_path / "out.json").read_text())["startup"]
    commands = section["commands"]
    assert {"python -c pass", "python -c 'import reactor'", "reactor get"} <= set(commands)
    assert commands["python -c pass"]["ratio"] == 1.0
    assert all(found["ms"] > 0 for found in commands.values())
    assert section["met"] == (commands["reactor get"]["ratio"] <= section["target"])


@pytest.mark.postgresql_only
def test_bench_derived_on_postgresql(tmp_path: Path) -> None:
    url = os.environ.get("REACTOR_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("reactor bench --backend postgresql needs $REACTOR_TEST_POSTGRES_URL")
    pytest.importorskip("psycopg")
    done = bench(
        "bench", "--quick", "--only", "derived", "--backend", "postgresql", "--postgres-url", url,
        cwd=tmp_path, timeout=160,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert_derived(result)
    assert not any("could not drop" in note for note in result["notes"])


@pytest.mark.timeout(300)
@pytest.mark.postgresql_only
def test_bench_durable_on_postgresql(tmp_path: Path) -> None:
    url = os.environ.get("REACTOR_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("reactor bench --backend postgresql needs $REACTOR_TEST_POSTGRES_URL")
    pytest.importorskip("psycopg")
    done = bench(
        "bench",
        "--quick",
        "--only",
        "durable",
        "--backend",
        "postgresql",
        "--postgres-url",
        url,
        cwd=tmp_path,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert_durable(result, "postgresql")
    assert not any("could not drop" in note for note in result["notes"])


@pytest.mark.timeout(120)
def test_bench_workflow_alone(tmp_path: Path) -> None:
    done = bench("bench", "--quick", "--only", "workflow", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "figures" not in result
    assert "scaling" not in result
    assert_workflow(result)


@pytest.mark.timeout(120)
def test_bench_prints_json_when_piped(tmp_path: Path) -> None:
    done = bench("bench", "--quick", "--only", "writers", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert_scaling(result, "sqlite")
    assert "figures" not in result, "--only writers leaves out the peers"
    assert result["backend"]["name"] == "sqlite"


@pytest.mark.timeout(120)
def test_global_table_option_is_the_bench_option(tmp_path: Path) -> None:
    """``reactor --table bench`` and ``reactor bench --table`` mean the same: tables."""
    done = bench("--table", "bench", "--quick", "--only", "writers", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("how writes scale"), done.stdout[:200]
    assert too_wide(done.stdout.splitlines()) == []


def test_bench_json_file_option_is_now_output(tmp_path: Path) -> None:
    """``--json`` is a switch, as everywhere in the CLI: the file is ``--output``."""
    done = bench("bench", "--json", "out.json", cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "out.json" in done.stderr
    assert not (tmp_path / "out.json").exists()


def test_bench_options_that_do_not_go_together(tmp_path: Path) -> None:
    done = bench("bench", "--scale", "--only", "writers", cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "--scale" in done.stderr
    done = bench("bench", "--postgres-url", "postgresql://x@y/z", cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "--backend postgresql" in done.stderr
    done = bench("bench", "--peers", "diskcache", "--only", "writers", cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "--peers goes with the comparison" in done.stderr


def test_bench_peers_must_be_known(tmp_path: Path) -> None:
    for given in ("memcached", "reactor", "diskcache,memcachd", ","):
        done = bench("bench", "--peers", given, cwd=tmp_path, timeout=60)
        assert done.returncode == 2, given
        assert "the peers are dict+lock, sqlite3, sqlite3x100" in " ".join(done.stderr.split())


@pytest.mark.timeout(300)
@pytest.mark.postgresql_only
def test_quick_bench_runs_reactor_on_postgresql(tmp_path: Path) -> None:
    url = os.environ.get("REACTOR_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("reactor bench --backend postgresql needs $REACTOR_TEST_POSTGRES_URL")
    pytest.importorskip("psycopg")
    done = bench(
        "bench",
        "--quick",
        "--peers",  # the peers do not change with reactor's backend: the SQLite pass has all
        "dict+lock",
        "--backend",
        "postgresql",
        "--postgres-url",
        url,
        "--output",
        "out.json",
        "--db-dir",
        "dbs",
        "--table",
        cwd=tmp_path,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr
    assert "reactor backend: PostgreSQL" in " ".join(done.stdout.split())
    assert too_wide(done.stdout.splitlines()) == []
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["backend"]["name"] == "postgresql"
    figures = result["figures"]
    assert sorted(figures) == ["dict+lock", "reactor"], (result["skipped"], result["errors"])
    assert "reactor" not in result["errors"], result["errors"]["reactor"]
    for mode in ("1t", "4t", "1p", "4p", "aio100"):
        for verb in VERBS:
            assert figures["reactor"][mode][verb]["ops_per_s"] > 0, (mode, verb)
    assert figures["reactor"]["4p"]["increment"]["count_exact"] is True
    assert result["events"]["cross_process"]["delivered"] > 0
    section = assert_scaling(result, "postgresql")
    pgbench = section["pgbench"]
    if pgbench["available"]:
        for count in QUICK_WRITERS:
            assert pgbench["clients"][count]["tps"] > 0
            assert section["processes"]["own_scope"][count]["vs_pgbench"] is not None
    else:
        assert pgbench["note"]
    queue = result["workflow"]["queue"]  # procrastinate beside reactor on PostgreSQL
    assert "procrastinate" not in result["workflow"]["queue_skipped"]
    assert queue["procrastinate"]["4p"]["exactly_once"] is True, queue["procrastinate"]
    assert queue["reactor"]["4p"]["exactly_once"] is True
    assert not any("could not drop" in note for note in result["notes"])
    assert list((tmp_path / "dbs").iterdir()) == [], "bench leaves no file behind"
