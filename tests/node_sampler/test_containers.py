"""The container watcher against the simulated Docker engine (the real HTTP API on a unix socket),
and against a raw server for answers no engine should give."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpumedic_sim.machine.docker import SimDockerEngine, new_container_id
from gpumedic_sim.machine.parts import SimContainer
from gpumedic_sim.machine.state import NodeState
from node_sampler.containers import DockerWatcher, parse_engine_time, signal_name
from node_sampler.docker_logs import LogTail
from node_sampler.immediate import ContainerExitReading

FAST = {"retry_s": 0.05, "backoff_s": 0.01, "timeout_s": 1.0}
OFF = "container events off"


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "docker.sock"


@pytest.fixture
def node() -> NodeState:
    return NodeState("gpu-node-07", 0)


@pytest.fixture
async def engine(node: NodeState, sock: Path):
    engine = SimDockerEngine(node, sock)
    await engine.start()
    yield engine
    await engine.stop()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(7)


def notify(node: NodeState, action: str, c: SimContainer) -> None:
    for listener in list(node.container_listeners):
        listener(action, c)


def start(node: NodeState, rng: random.Random, name: str, *, logs: list = (), event: bool = True) -> SimContainer:
    c = SimContainer(id=new_container_id(rng), name=name, logs=list(logs))
    node.containers[c.id] = c
    if event:
        notify(node, "start", c)
    return c


def die(node: NodeState, c: SimContainer, code: int, *, oom: bool = False, at: datetime | None = None) -> None:
    c.running = False
    c.exit_code = code
    c.oom_killed = oom
    c.finished_at = at or datetime.now(UTC)
    notify(node, "die", c)


def destroy(node: NodeState, c: SimContainer) -> None:
    node.containers.pop(c.id)
    notify(node, "destroy", c)


async def until(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def watching(sock: Path, **options):
    exits: asyncio.Queue[ContainerExitReading] = asyncio.Queue()
    watcher = DockerWatcher(sock, exits.put_nowait, **{**FAST, **options})
    task = asyncio.create_task(watcher.run())
    try:
        yield watcher, exits
    finally:
        if task.done():
            task.result()  # run() must never end on its own; this re-raises what ended it
            pytest.fail("run() returned")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()


async def next_exit(exits: asyncio.Queue[ContainerExitReading], timeout: float = 3.0) -> ContainerExitReading:
    return await asyncio.wait_for(exits.get(), timeout)


async def connected(watcher: DockerWatcher) -> None:
    await until(lambda: watcher.connected)


# --- exits ---------------------------------------------------------------------------------


async def test_oom_kill_reaches_on_exit_with_inspected_fields_and_last_log_lines(engine, node, sock, rng) -> None:
    at = datetime(2026, 11, 22, 10, 17, 41, 123456, tzinfo=UTC)
    async with watching(sock, log_lines=3) as (watcher, exits):
        await connected(watcher)
        c = start(node, rng, "selfplay-3", logs=[f"game {i} done in 41.2s" for i in range(1, 6)])
        die(node, c, 137, oom=True, at=at)
        reading = await next_exit(exits)
    assert reading == ContainerExitReading(
        container_id=c.id,
        exit_code=137,
        name="selfplay-3",
        image="registry.example/selfplay:2026.11",
        oom_killed=True,
        finished_at=at,
        last_log_lines=("game 3 done in 41.2s", "game 4 done in 41.2s", "game 5 done in 41.2s"),
    )


@pytest.mark.parametrize("code", [139, 143])
async def test_signal_exits_carry_their_code_and_no_oom(engine, node, sock, rng, code) -> None:
    async with watching(sock) as (watcher, exits):
        await connected(watcher)
        c = start(node, rng, "selfplay-1", logs=["starting", "Segmentation fault (core dumped)"])
        die(node, c, code)
        reading = await next_exit(exits)
    assert (reading.container_id, reading.exit_code, reading.oom_killed) == (c.id, code, False)
    assert reading.last_log_lines == ("starting", "Segmentation fault (core dumped)")
    assert reading.finished_at is not None and reading.finished_at.tzinfo is not None


async def test_an_exit_the_engine_was_asked_for_carries_its_signal(engine, node, sock, rng) -> None:
    async with watching(sock) as (watcher, exits):
        await connected(watcher)
        stopped = start(node, rng, "selfplay-stopped")
        stopped.engine_signal = 15  # docker stop: `kill` (signal 15), then `die`
        die(node, stopped, 143)
        asked = await next_exit(exits)
        other = start(node, rng, "selfplay-killed")
        die(node, other, 143)  # a SIGTERM from outside the engine: no `kill` event
        unasked = await next_exit(exits)
    assert (asked.container_id, asked.exit_code, asked.engine_signal) == (stopped.id, 143, "SIGTERM")
    assert (unasked.container_id, unasked.engine_signal) == (other.id, None)


@pytest.mark.parametrize(("value", "name"), [("15", "SIGTERM"), ("9", "SIGKILL"), ("SIGTERM", "SIGTERM"), ("term", "SIGTERM"), ("", "unknown"), ("99", "signal 99")])
def test_engine_signals_are_named(value, name) -> None:
    assert signal_name(value) == name


async def test_container_removed_before_inspect_still_exits_with_the_event_code(engine, node, sock, rng) -> None:
    async with watching(sock) as (watcher, exits):
        await connected(watcher)
        c = start(node, rng, "oneshot", logs=["will be gone"])
        await until(lambda: watcher.exists(c.id) is True)
        # docker run --rm: removed right after it died, before anyone could inspect it
        die(node, c, 137, oom=True)
        destroy(node, c)
        reading = await next_exit(exits)
        await until(lambda: watcher.exists(c.id) is False)
    assert reading.container_id == c.id
    assert reading.exit_code == 137
    assert reading.name == "oneshot" and reading.image == c.image  # from the event's attributes
    assert reading.oom_killed is True  # from the engine's `oom` event
    assert reading.last_log_lines == ()
    assert reading.logs_lost == "the engine had removed the container before its log could be read (docker run --rm, or removed at once)"
    assert reading.finished_at is not None and abs((reading.finished_at - datetime.now(UTC)).total_seconds()) < 5


async def test_a_container_whose_logging_driver_keeps_nothing_says_its_log_is_lost_and_why(engine, node, sock, rng) -> None:
    async with watching(sock) as (watcher, exits):
        await connected(watcher)
        c = start(node, rng, "selfplay-0", logs=["never kept"])
        c.log_driver = "none"
        die(node, c, 139)
        reading = await next_exit(exits)
    assert reading.last_log_lines == () and reading.exit_code == 139
    assert reading.logs_lost == "the engine cannot give its log (none logging driver: HTTP 501, configured logging driver does not support reading)"


async def test_logs_not_asked_for_are_never_called_lost(engine, node, sock, rng) -> None:
    async with watching(sock, log_lines=0) as (watcher, exits):
        await connected(watcher)
        c = start(node, rng, "oneshot")
        die(node, c, 1)
        destroy(node, c)
        reading = await next_exit(exits)
    assert reading.logs_lost is None


async def test_exits_without_on_exit_are_only_tracked(engine, node, sock, rng) -> None:
    watcher = DockerWatcher(sock, **FAST)
    task = asyncio.create_task(watcher.run())
    try:
        await connected(watcher)
        c = start(node, rng, "quiet")
        die(node, c, 1)
        await until(lambda: watcher.exists(c.id) is True)
        destroy(node, c)
        await until(lambda: watcher.exists(c.id) is False)
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- exists --------------------------------------------------------------------------------


async def test_exists_by_id_and_prefix_and_none_without_engine(node, sock, rng) -> None:
    before = start(node, rng, "before", event=False)  # listed, never seen as an event
    engine = SimDockerEngine(node, sock)
    async with watching(sock, refresh_s=0.1) as (watcher, _exits):
        assert watcher.exists(before.id) is None  # not asked yet
        await engine.start()
        try:
            await connected(watcher)
            assert watcher.exists(before.id) is True
            assert watcher.exists(before.id[:12].upper()) is True
            assert watcher.exists(new_container_id(rng)) is False
            assert watcher.exists(before.id[:11]) is False  # too short to name one
            assert watcher.exists("not-a-container") is False
            started = start(node, rng, "started")
            await until(lambda: watcher.exists(started.id) is True)
            # a container the engine lists but whose event never came: found by the refresh
            quiet = start(node, rng, "quiet", event=False)
            await until(lambda: watcher.exists(quiet.id) is True, timeout=2.0)
            destroy(node, started)
            await until(lambda: watcher.exists(started.id) is False)
        finally:
            await engine.stop()
        await until(lambda: watcher.exists(before.id) is None)


# --- the engine coming and going ------------------------------------------------------------


async def test_no_engine_logs_one_line_then_follows_the_engine_once_it_appears(node, sock, rng, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="node_sampler.containers")
    async with watching(sock) as (watcher, exits):
        await asyncio.sleep(0.4)  # ~8 checks at retry_s=0.05
        assert watcher.exists(new_container_id(rng)) is None
        off = [r for r in caplog.records if OFF in r.getMessage()]
        assert [r.getMessage() for r in off] == [f"container events off: no Docker engine at {sock}"]
        assert off[0].levelno == logging.INFO
        checks = [r for r in caplog.records if "still off" in r.getMessage()]
        assert len(checks) >= 3 and all(r.levelno == logging.DEBUG for r in checks)

        engine = SimDockerEngine(node, sock)
        await engine.start()
        try:
            await connected(watcher)
            c = start(node, rng, "late")
            die(node, c, 143)
            reading = await next_exit(exits)
        finally:
            await engine.stop()
    assert (reading.container_id, reading.exit_code) == (c.id, 143)
    assert len([r for r in caplog.records if OFF in r.getMessage()]) == 1
    assert len([r for r in caplog.records if "container events on" in r.getMessage()]) == 1


async def test_engine_restart_reconnects_reloads_the_list_and_later_events_arrive(node, sock, rng, caplog) -> None:
    caplog.set_level(logging.INFO, logger="node_sampler.containers")
    engine = SimDockerEngine(node, sock)
    await engine.start()
    async with watching(sock) as (watcher, exits):
        await connected(watcher)
        first = start(node, rng, "first")
        die(node, first, 139)
        assert (await next_exit(exits)).exit_code == 139

        await engine.stop()
        await until(lambda: not watcher.connected)
        during = start(node, rng, "during-outage")  # no engine to report it
        engine = SimDockerEngine(node, sock)
        await engine.start()
        try:
            await connected(watcher)
            assert watcher.exists(during.id) is True  # the list was reloaded
            after = start(node, rng, "after")
            die(node, after, 137, oom=True)
            reading = await next_exit(exits)
        finally:
            await engine.stop()
    assert (reading.container_id, reading.exit_code, reading.oom_killed) == (after.id, 137, True)
    assert exits.empty()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("broke" in m for m in messages) >= 1
    assert sum("container events on" in m for m in messages) >= 2
    assert not any(OFF in m and "no Docker engine" in m for m in messages)  # that line is for a node without one


async def test_cut_stream_replays_missed_events_once(engine, node, sock, rng) -> None:
    async with watching(sock) as (watcher, exits):
        await connected(watcher)
        first = start(node, rng, "first")
        die(node, first, 1)
        assert (await next_exit(exits)).container_id == first.id

        engine.cut_event_streams()
        missed = start(node, rng, "missed")
        die(node, missed, 143)  # while the watcher is disconnected
        reading = await next_exit(exits)
        await asyncio.sleep(0.1)
    assert (reading.container_id, reading.exit_code) == (missed.id, 143)
    assert exits.empty()  # `first` was replayed by `since` too, and dropped as seen


async def test_an_exit_before_the_first_connection_is_still_reported(engine, node, sock, rng) -> None:
    """A sampler starting on a busy node may take seconds to reach its engine: what exited since
    the watcher was made is replayed by `since` on the first connection too."""
    exits: asyncio.Queue[ContainerExitReading] = asyncio.Queue()
    watcher = DockerWatcher(sock, exits.put_nowait, **FAST)
    early = start(node, rng, "early")
    die(node, early, 139)  # before the watcher ever connects
    task = asyncio.create_task(watcher.run())
    try:
        reading = await next_exit(exits)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert (reading.container_id, reading.exit_code) == (early.id, 139)


# --- what no engine should send -------------------------------------------------------------


class RawEngine:
    """Answers by path from `routes` (raw HTTP bytes); `/events` sends `event_lines` chunked."""

    def __init__(self, sock: Path) -> None:
        self.sock = sock
        self.routes: dict[str, bytes] = {
            "/_ping": _answer(b"OK", "text/plain"),
            "/containers/json": _answer(b"[]"),
        }
        self.event_lines: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> RawEngine:
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.sock))
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        for w in list(self._writers):
            w.close()
        await self._server.wait_closed()

    async def _handle(self, reader, writer) -> None:
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ")[1].decode().split("?")[0]
            if path == "/events":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                for line in self.event_lines:
                    writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                await writer.drain()
                await reader.read()
                return
            writer.write(self.routes.get(path, _answer(b'{"message": "No such container"}', status="404 Not Found")))
            await writer.drain()
        finally:
            self._writers.discard(writer)
            writer.close()


def _answer(body: bytes, content_type: str = "application/json", status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def _die(cid: str, code, nano: int = 1_790_000_000_123_456_789, **attributes) -> bytes:
    event = {
        "Type": "container",
        "Action": "die",
        "Actor": {"ID": cid, "Attributes": {"exitCode": code, **attributes}},
        "time": nano // 10**9,
        "timeNano": nano,
    }
    return json.dumps(event).encode() + b"\n"


async def test_bad_event_lines_are_warned_about_and_skipped(sock, rng, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="node_sampler.containers")
    bad_code, good = new_container_id(rng), new_container_id(rng)
    async with RawEngine(sock) as raw:
        raw.event_lines = [
            b'{"Type": "container", "Action": "die", \x00\xff not json at all ' + b"x" * 500 + b"\n",
            b"[1, 2, 3]\n",
            _die(bad_code, "SIGKILL"),
            b"[" * 100_000 + b"\n",
            # one event split over two chunks, then one with no newline between it and the next chunk
            _die(good, "139", 1_790_000_001_000_000_000, name="/trainer")[:40],
            _die(good, "139", 1_790_000_001_000_000_000, name="/trainer")[40:],
        ]
        async with watching(sock) as (_watcher, exits):
            reading = await next_exit(exits)
            await asyncio.sleep(0.05)
    assert (reading.container_id, reading.exit_code, reading.name) == (good, 139, "trainer")
    assert reading.oom_killed is None and reading.last_log_lines == ()
    assert exits.empty()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    not_json = [m for m in warnings if "not JSON" in m]
    assert len(not_json) == 2  # the garbage, and the nesting too deep to parse
    assert all(len(m) < 400 for m in not_json)  # clipped
    assert any("not an event object" in m for m in warnings)
    assert any("not an integer" in m and bad_code[:12] in m for m in warnings)


async def test_hostile_inspect_fields_are_cleaned_and_cut_to_the_event_limits(sock, rng) -> None:
    cid = new_container_id(rng)
    inspected = {
        "Id": cid,
        "Name": "/" + "\x1b[31mred\x1b[0m\x00" + "n" * 1000,
        "State": {"Running": False, "ExitCode": 139, "OOMKilled": "yes", "FinishedAt": "garbage"},
        "Config": {"Image": "i" * 5000, "Tty": False},
    }
    async with RawEngine(sock) as raw:
        raw.routes[f"/containers/{cid}/json"] = _answer(json.dumps(inspected).encode())
        # no Content-Type: Config.Tty (false) says multiplexed
        frames = b"".join(b"\x02\0\0\0" + len(p).to_bytes(4, "big") + p for p in (b"err one\n", b"err two\n"))
        raw.routes[f"/containers/{cid}/logs"] = f"HTTP/1.1 200 OK\r\nContent-Length: {len(frames)}\r\n\r\n".encode() + frames
        raw.event_lines = [_die(cid, "139")]
        async with watching(sock) as (_watcher, exits):
            reading = await next_exit(exits)
    assert reading.name == "red" + "n" * 253 and len(reading.name) == 256
    assert reading.image == "i" * 512
    assert reading.oom_killed is None  # "yes" is not a boolean
    assert reading.finished_at == datetime.fromtimestamp(1_790_000_000, UTC).replace(microsecond=123456)  # the event's
    assert reading.last_log_lines == ("err one", "err two")


@pytest.mark.parametrize(("body", "said"), [
    (json.dumps({"message": "\x1b[2Jno log here\x00" + "x" * 2000}).encode(), "HTTP 500, no log here" + "x" * 149),
    (json.dumps({"message": "x" * 5000}).encode(), "HTTP 500"),  # cut at 4 KiB: no JSON left to read
    (b"<html>" + b"a" * 50, "HTTP 500"),
])
async def test_a_hostile_refusal_of_a_log_is_said_cleaned_and_short(sock, rng, body, said) -> None:
    cid = new_container_id(rng)
    inspected = {"Id": cid, "State": {"Running": False, "ExitCode": 1}, "Config": {"Tty": False},
                 "HostConfig": {"LogConfig": {"Type": "\x1b]0;pwned\x07" + "d" * 100}}}
    async with RawEngine(sock) as raw:
        raw.routes[f"/containers/{cid}/json"] = _answer(json.dumps(inspected).encode())
        raw.routes[f"/containers/{cid}/logs"] = f"HTTP/1.1 500 Internal Server Error\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        raw.event_lines = [_die(cid, "1")]
        async with watching(sock) as (_watcher, exits):
            reading = await next_exit(exits)
    assert reading.logs_lost is not None and len(reading.logs_lost) <= 300
    assert reading.logs_lost.endswith(f" logging driver: {said})") and "\x1b" not in reading.logs_lost and "\x07" not in reading.logs_lost


# --- logs ------------------------------------------------------------------------------------


async def test_tty_logs_are_read_raw(engine, node, sock, rng) -> None:
    async with watching(sock) as (watcher, exits):
        await connected(watcher)
        c = start(node, rng, "tty", logs=["first line", "second line"])
        c.tty = True
        die(node, c, 2)
        reading = await next_exit(exits)
    assert reading.last_log_lines == ("first line", "second line")


async def test_hostile_log_bytes_are_cleaned_cut_and_only_the_last_kept(engine, node, sock, rng) -> None:
    logs = [f"old {i}" for i in range(30)] + [
        b"nul\x00 and bell\x07 and\ttab",
        "\x1b[1;31mERROR\x1b[0m colours",
        b"bad utf8 \xff\xfe end",
        "x" * 5000,
        "progress 10%\rprogress 100%",
        "\x00\x01\x02",  # nothing left once cleaned
        "last",
    ]
    async with watching(sock, log_lines=6) as (watcher, exits):
        await connected(watcher)
        c = start(node, rng, "hostile", logs=logs)
        die(node, c, 1)
        reading = await next_exit(exits)
    assert reading.last_log_lines == (
        "nul and bell and\ttab",
        "ERROR colours",
        "bad utf8 \ufffd\ufffd end",
        "x" * 1024,
        "progress 10%progress 100%",
        "last",
    )


def test_log_tail_demultiplexes_frames_split_anywhere_and_keeps_streams_apart() -> None:
    def frame(stream: int, payload: bytes) -> bytes:
        return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload

    stream = frame(1, b"out: half ") + frame(2, b"err: whole\n") + frame(1, b"of a line\n") + frame(2, b"tail")
    tail = LogTail(10, multiplexed=True)
    for i in range(len(stream)):
        tail.feed(stream[i : i + 1])  # one byte at a time: headers and payloads split everywhere
    assert tail.lines() == ("err: whole", "out: half of a line", "tail")

    raw = LogTail(10, multiplexed=False)
    raw.feed(frame(1, b"abc\n"))
    assert raw.lines() == ("abc",)  # the header bytes are control characters, cleaned away

    fallback = LogTail(10, multiplexed=True)
    fallback.feed(b"plain text, not frames\nsecond\n")
    assert fallback.lines() == ("plain text, not frames", "second")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-22T10:17:41.123456789Z", datetime(2026, 11, 22, 10, 17, 41, 123456, tzinfo=UTC)),
        ("2026-11-22T12:17:41+02:00", datetime(2026, 11, 22, 10, 17, 41, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", None),
        ("yesterday", None),
        (12, None),
    ],
)
def test_engine_times(value, expected) -> None:
    assert parse_engine_time(value) == expected
