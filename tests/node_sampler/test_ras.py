"""NCCL's RAS as the sampler asks it: the answers (tests/fixtures/nccl-ras, from NCCL's documents),
the line protocol against a real TCP server that speaks it as NCCL's guide and client describe,
and when a node asks at all."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from gpumedic_events import GpuProcess, GpuSample, JobTag, NcclRasAnswer, NodeSampled, RasRank

from node_sampler.ras import RasError, RasWatch, ask, parse_json, parse_text

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nccl-ras"
AT = datetime(2026, 11, 28, 9, 12, tzinfo=UTC)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_a_healthy_job_misses_no_rank():
    answer = parse_text(fixture("healthy.txt"), AT)
    assert (answer.nccl_version, answer.output, answer.communicators) == ("2.26.5+cuda12.8", "text", 8)  # one group of 8
    assert answer.missing == () and answer.missing_count == 0 and answer.error is None


def test_an_unresponsive_process_is_its_rank_with_host_pid_and_gpu():
    answer = parse_text(fixture("unresponsive.txt"), AT)
    assert answer.missing == (RasRank(rank=30, communicator_size=32, host="10.20.3.14", pid=51207, gpu=6, dead=False),)
    assert answer.missing_count == 1


def test_a_process_unreachable_for_a_minute_is_dead():
    (rank,) = parse_text(fixture("dead.txt"), AT).missing
    assert (rank.rank, rank.host, rank.pid, rank.dead) == (30, "10.20.3.14", 51207, True)


def test_newer_text_lists_each_missing_rank_with_its_process_and_nvml_index():
    answer = parse_text(fixture("ranks-listed.txt"), AT)
    assert answer.nccl_version == "2.27.7+cuda12.9" and answer.communicators == 9  # groups of 1 and 8
    assert answer.missing == (
        RasRank(rank=10, communicator_size=16, host="fd00:0:0:12::5", pid=7781, gpu=2),
        RasRank(rank=12, communicator_size=16, host="fd00:0:0:12::5", pid=7783, gpu=4),
    )  # the MISMATCH warning's rank 5 answered: it is not missing


def test_text_that_counts_missing_ranks_without_listing_them_still_counts():
    text = fixture("unresponsive.txt").replace("Missing communicator data from 1 rank\n  The missing rank: 30\n",
                                               "Missing communicator data from 12 ranks\n")
    text = text.replace("  Process 51207 on node 10.20.3.14 managing GPU 6\n", "")
    answer = parse_text(text, AT)
    assert answer.missing == () and answer.missing_count == 12


def test_json_keeps_the_unresponsive_rank_and_leaves_a_tear_down_out():
    answer = parse_json(fixture("missing.json"), AT)
    assert (answer.nccl_version, answer.output, answer.communicators) == ("2.29.1", "json", 2)
    assert answer.missing == (RasRank(rank=1, communicator_size=2, host="10.44.0.22", pid=90388, gpu=3, dead=False),)


def test_hostile_values_are_dropped_never_sent():
    answer = parse_json(fixture("hostile.json"), AT)
    assert answer.nccl_version is None
    assert answer.missing == (
        RasRank(rank=7, communicator_size=64, host=None, pid=1234, gpu=None, dead=True),
        RasRank(rank=None, communicator_size=64, host="node-8", pid=None, gpu=None, dead=False),
    )
    assert "rm -rf" not in answer.model_dump_json()


@pytest.mark.parametrize("text", ["", "{", '{"communicators": 3}', "[1, 2]", "[" * 100_000])
def test_what_is_not_its_json_is_an_error(text):
    with pytest.raises(RasError):
        parse_json(text, AT)


def test_what_is_not_its_text_is_an_error():
    with pytest.raises(RasError):
        parse_text("<html><body>502 Bad Gateway</body></html>", AT)


def test_many_missing_ranks_are_counted_and_the_first_64_listed():
    rows = "\n".join(f"  Rank {r} -- GPU {r % 8} managed by process {1000 + r} on node 10.0.{r // 8}.1" for r in range(100))
    text = (fixture("ranks-listed.txt").split("\nErrors\n")[0]
            + f"\nErrors\n======\n\n#0-0 (a0c3b1f9e8d75260) INCOMPLETE\n  Missing communicator data from 100 ranks\n{rows}\n")
    answer = parse_text(text, AT)
    assert answer.missing_count == 100 and len(answer.missing) == 64 and answer.missing[63].rank == 63


class RasServer:
    """NCCL's client port as its guide and `ncclras` describe it: text lines; CLIENT PROTOCOL is
    answered SERVER PROTOCOL 2; SET FORMAT json OK from 2.28.7 (an ERROR line before); STATUS or
    VERBOSE STATUS is answered with the status, and the connection closed."""

    def __init__(self, status: str, *, json_ok: bool = True, mute: bool = False, greeting: str = "SERVER PROTOCOL 2") -> None:
        self.status, self.json_ok, self.mute, self.greeting = status, json_ok, mute, greeting
        self.heard: list[str] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := (await reader.readline()).decode().strip():
                self.heard.append(line)
                if self.mute:
                    continue
                word = line.lower()
                if word.startswith("client protocol "):
                    writer.write(f"{self.greeting}\n".encode())
                elif word.startswith("set format "):
                    writer.write(b"OK\n" if self.json_ok else f"ERROR: Unknown command {line}\n".encode())
                elif word in ("status", "verbose status"):
                    writer.write(self.status.encode())
                    await writer.drain()
                    break
                else:
                    writer.write(f"ERROR: Unknown command {line}\n".encode())
                await writer.drain()
        finally:
            writer.close()

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


async def test_asks_for_json_and_reads_it():
    server = RasServer(fixture("missing.json"))
    async with server as port:
        answer = await ask("127.0.0.1", port, 5.0)
    assert server.heard == ["CLIENT PROTOCOL 2", "SET FORMAT json", "VERBOSE STATUS"]
    assert answer.output == "json" and answer.missing[0].pid == 90388 and answer.error is None


async def test_an_older_nccl_refusing_json_is_read_as_text():
    async with RasServer(fixture("dead.txt"), json_ok=False) as port:
        answer = await ask("127.0.0.1", port, 5.0)
    assert answer.output == "text" and answer.missing[0].dead and answer.missing[0].rank == 30


async def test_nothing_listening_says_why_ras_may_be_absent():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    answer = await ask("127.0.0.1", port, 5.0)
    assert answer.missing == () and "nothing listens" in answer.error and "NCCL_RAS_ENABLE=0" in answer.error


async def test_a_port_that_accepts_and_never_answers_is_a_timeout_not_a_hang():
    async with RasServer("", mute=True) as port:
        answer = await ask("127.0.0.1", port, 0.5)
    assert "did not answer within" in answer.error


async def test_a_stranger_on_the_port_is_named():
    async with RasServer("", greeting="HTTP/1.1 400 Bad Request") as port:
        answer = await ask("127.0.0.1", port, 5.0)
    assert "not SERVER PROTOCOL" in answer.error


async def test_an_answer_that_is_not_its_output_is_named():
    async with RasServer("Segmentation fault\n", json_ok=False) as port:
        answer = await ask("127.0.0.1", port, 5.0)
    assert answer.output is None and "not its text output" in answer.error


def sample(*utilizations: int | None, tagged: bool = True) -> NodeSampled:
    job = JobTag(id="torchelastic:run-7", rank=3, world_size=16, local_world_size=8, nodes=2) if tagged else None
    gpus = tuple(GpuSample(index=i, uuid=f"GPU-{i}", name="H100", utilization_gpu_pct=u,
                           processes=(GpuProcess(pid=100 + i, command="python train.py", job=job),))
                 for i, u in enumerate(utilizations))
    return NodeSampled(source="node-sampler", node_id="gpu-node-07", interval_s=5.0, gpus=gpus)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_asks_only_after_the_ranks_idle_long_enough_then_every_interval():
    asked: list[float] = []
    clock = Clock()

    async def fake_ask(host: str, port: int, timeout_s: float) -> NcclRasAnswer:
        asked.append(clock.now)
        return NcclRasAnswer(asked_at=AT, output="json", missing=(RasRank(rank=9),), missing_count=1)

    watch = RasWatch(after_s=120, every_s=60, ask=fake_ask, clock=clock)
    for t in range(0, 300, 5):
        clock.now = t
        out = watch.observe(sample(0, 1))
        await asyncio.sleep(0)
    assert asked == [120, 180, 240]
    assert out.nccl_ras is not None and out.nccl_ras.missing[0].rank == 9
    clock.now = 300
    assert watch.observe(sample(0, 97)).nccl_ras is None  # one rank works again: the node's part goes on
    clock.now = 305
    assert watch.observe(sample(0, 0)).nccl_ras is None and asked == [120, 180, 240]  # idle anew: the wait starts over


async def test_untagged_or_unreadable_never_asks():
    asked: list[int] = []

    async def fake_ask(host: str, port: int, timeout_s: float) -> NcclRasAnswer:
        asked.append(port)
        return NcclRasAnswer(asked_at=AT)

    clock = Clock()
    watch = RasWatch(after_s=0, ask=fake_ask, clock=clock)
    for t in range(0, 100, 5):
        clock.now = t
        assert watch.observe(sample(0, 0, tagged=False)).nccl_ras is None
        assert watch.observe(sample(0, None)).nccl_ras is None
        await asyncio.sleep(0)
    assert asked == []


async def test_a_query_that_breaks_is_said_in_the_sample_never_raised_from_it():
    async def broken_ask(host: str, port: int, timeout_s: float) -> NcclRasAnswer:
        raise RuntimeError("a bug")

    clock = Clock()
    watch = RasWatch(after_s=0, ask=broken_ask, clock=clock)
    watch.observe(sample(0))
    await asyncio.sleep(0)
    answer = watch.observe(sample(0)).nccl_ras
    assert answer is not None and answer.error == "asking NCCL's RAS failed: RuntimeError"


def test_a_version_line_longer_than_a_version_is_dropped_not_raised():
    text = fixture("healthy.txt").replace("2.26.5+cuda12.8", "2.26.5+" + "x" * 200)
    assert parse_text(text, AT).nccl_version is None


async def test_a_slow_answer_does_not_hold_the_sample_and_a_query_of_a_hang_that_ended_is_dropped():
    release = asyncio.Event()

    async def slow_ask(host: str, port: int, timeout_s: float) -> NcclRasAnswer:
        await release.wait()
        return NcclRasAnswer(asked_at=AT, output="text", missing=(RasRank(rank=1),), missing_count=1)

    clock = Clock()
    watch = RasWatch(after_s=0, every_s=60, ask=slow_ask, clock=clock)
    assert watch.observe(sample(0)).nccl_ras is None  # asked; the sample goes out now
    await asyncio.sleep(0)
    assert watch.observe(sample(80)).nccl_ras is None  # working again: the query is cancelled
    release.set()
    await asyncio.sleep(0)
    assert watch.observe(sample(0)).nccl_ras is None and watch._query is not None  # a fresh query, nothing stale
    await watch.close()


async def test_the_sampler_carries_what_ras_said_once_its_ranks_idle():
    """The real Sampler over a fake NVML whose tagged rank idles, asking a real server on TCP."""
    from node_sampler.jobenv import JobEnv
    from node_sampler.procs import ProcessInfo
    from node_sampler.sampler import Sampler
    from tests.node_sampler.fakes import FakeGpu, FakeNvml, FakeProcessTable

    job = JobEnv(id="torchelastic:run-7", rank=3, world_size=16, local_world_size=8, nodes=2)
    nvml = FakeNvml([FakeGpu(uuid="GPU-aaaa", util=0, processes=[(41230, 20480)])])
    table = FakeProcessTable({41230: ProcessInfo(41230, 8812345, "python train.py", job=job)})
    async with RasServer(fixture("unresponsive.txt"), json_ok=False) as port:
        sampler = Sampler("gpu-node-07", nvml, table, [], 5.0, ras=RasWatch("127.0.0.1", port, after_s=0, every_s=60))
        first = await sampler.sample()
        assert first.nccl_ras is None  # asked now, answered in the background
        for _ in range(100):
            await asyncio.sleep(0.01)
            if sampler.ras._query is not None and sampler.ras._query.done():
                break
        second = await sampler.sample()
    assert second.nccl_ras is not None and second.nccl_ras.missing[0].rank == 30
    assert NodeSampled.model_validate_json(second.model_dump_json()) == second  # it crosses the bus as it is
    sampler.close()


async def test_the_port_a_jobs_nccl_ras_addr_names_is_asked():
    asked: list[int] = []

    async def fake_ask(host: str, port: int, timeout_s: float) -> NcclRasAnswer:
        asked.append(port)
        return NcclRasAnswer(asked_at=AT)

    watch = RasWatch(port=28028, after_s=0, ask=fake_ask, clock=Clock())
    watch.observe(sample(0, 0), {100: 12346, 101: 12345, 999: 1})  # pid 999 is no rank here
    await asyncio.sleep(0)
    assert asked == [12345]
