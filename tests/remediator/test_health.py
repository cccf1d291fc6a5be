"""SSH health checks against the real sshd: a read-only login to every inventory node, whose
answer becomes a NodeSshChecked with the cause the runbooks meet, published on a change and on
every failure."""

from __future__ import annotations

import asyncio
import socket
import time

import asyncssh
import pytest

from gpumedic_bus.lateness import LAGGING_AFTER_S, LoopLag
from gpumedic_bus.streams import partition_of
from gpumedic_nodes.ssh import SshExecutor
from remediator.health import Checked, SshHealth, next_check

pytestmark = pytest.mark.sshd


def test_an_answer_is_published_when_it_changes_and_on_every_failure():
    state, event = next_check(None, "n1", "ok", "")
    assert event.reachable and event.failures == 0
    assert next_check(state, "n1", "ok", "") == (Checked("ok", 0), None)
    state, event = next_check(state, "n1", "refused", "connection refused")
    assert (event.reachable, event.cause, event.failures) == (False, "refused", 1)
    state, event = next_check(state, "n1", "refused", "connection refused")
    assert event.failures == 2
    state, event = next_check(state, "n1", "ok", "")
    assert event.reachable and state == Checked("ok", 0)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_each_way_a_login_fails_has_its_cause(sshd, tmp_path):
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts TCP, never says a word
    silent_port = silent.sockets[0].getsockname()[1]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "nodes:\n"
        f"  ok-node: {{host: 127.0.0.1, port: {sshd.port}, user: root}}\n"
        f"  refusing: {{host: 127.0.0.1, port: {_closed_port()}, user: root}}\n"
        f"  wedged: {{host: 127.0.0.1, port: {silent_port}, user: root}}\n"
    )
    stranger = tmp_path / "stranger_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))

    impostor = tmp_path / "known_hosts"  # trusts another key for the same address: a reinstalled node, or someone else
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    impostor.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")

    def health(key, known_hosts=sshd.known_hosts) -> SshHealth:
        executor = SshExecutor(inventory=inventory, known_hosts=known_hosts, client_key=key, connect_timeout_s=1.0, command_timeout_s=2.0)
        return SshHealth(executor, inventory, interval_s=60, concurrency=4)

    published = []

    async def publish(event) -> None:
        published.append(event)

    try:
        await health(sshd.client_key).check_all(publish)
        by_node = {e.node_id: e for e in published}
        assert by_node["ok-node"].reachable and by_node["ok-node"].cause == "ok"
        assert (by_node["refusing"].cause, by_node["refusing"].detail) == ("refused", "connection refused")
        assert by_node["wedged"].cause == "timeout"
        published.clear()
        await health(stranger).check_all(publish)
        assert {e.node_id: e.cause for e in published}["ok-node"] == "auth_refused"
        published.clear()
        await health(sshd.client_key, impostor).check_all(publish)
        changed = {e.node_id: e for e in published}["ok-node"]
        assert changed.cause == "host_key_changed" and "not trusted" in changed.detail
        assert not any(c for e in published for c in ("BEGIN", "PRIVATE") if c in e.detail)  # no key material
    finally:
        silent.close()


async def test_an_instance_checks_only_the_nodes_of_its_partitions_and_a_node_handed_back_starts_afresh(sshd, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes:\n" + "".join(f"  n{i}: {{host: 127.0.0.1, port: {sshd.port}, user: root}}\n" for i in range(6)))
    executor = SshExecutor(inventory=inventory, known_hosts=sshd.known_hosts, client_key=sshd.client_key, connect_timeout_s=2.0,
                           command_timeout_s=2.0)
    health = SshHealth(executor, inventory, interval_s=60, concurrency=4)
    published = []

    async def publish(event) -> None:
        published.append(event.node_id)

    held = {partition_of(n) for n in ("n0", "n1", "n2")}
    mine = [f"n{i}" for i in range(6) if partition_of(f"n{i}") in held]
    await health.check_all(publish, mine=lambda node: partition_of(node) in held)
    assert sorted(published) == mine and set(health.states) == set(mine)
    published.clear()
    await health.check_all(publish, mine=lambda node: False)  # all handed to another instance
    assert published == [] and health.states == {}
    await health.check_all(publish, mine=lambda node: True)  # and back: each reachable node said again
    assert sorted(published) == [f"n{i}" for i in range(6)]


async def _refusing_and_wedged(sshd, tmp_path, *, timeout_s: float, interval_s: float, concurrency: int):
    """A node whose SSH port refuses and one that accepts TCP and never says a word (it holds its
    login for the whole connect timeout); the silent server, and the checks of both."""
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "nodes:\n"
        f"  refusing: {{host: 127.0.0.1, port: {_closed_port()}, user: root}}\n"
        f"  wedged: {{host: 127.0.0.1, port: {silent.sockets[0].getsockname()[1]}, user: root}}\n"
    )
    executor = SshExecutor(inventory=inventory, known_hosts=sshd.known_hosts, client_key=sshd.client_key,
                           connect_timeout_s=timeout_s, command_timeout_s=timeout_s)
    return silent, SshHealth(executor, inventory, interval_s=interval_s, concurrency=concurrency)


async def test_a_node_s_answer_is_published_as_it_comes_not_at_the_round_s_end(sshd, tmp_path):
    """A round over a large inventory takes about as long as the interval (a wedged node alone holds
    it for the connect timeout): a failure found early in it is not held back until the round ends."""
    silent, health = await _refusing_and_wedged(sshd, tmp_path, timeout_s=3.0, interval_s=60, concurrency=4)
    published: asyncio.Queue = asyncio.Queue()

    async def publish(event) -> None:
        published.put_nowait(event)

    round_ = asyncio.create_task(health.check_all(publish))
    try:
        first = await asyncio.wait_for(published.get(), 2.5)  # well before the wedged node's 3 s timeout ends the round
        assert (first.node_id, first.cause) == ("refusing", "refused") and not round_.done()
        await asyncio.wait_for(round_, 10)
        assert (await published.get()).cause == "timeout"
        assert {n: s.failures for n, s in health.states.items()} == {"refusing": 1, "wedged": 1}
    finally:
        round_.cancel()
        silent.close()
        await asyncio.gather(round_, return_exceptions=True)


async def test_the_check_again_follows_the_node_s_own_failure_not_the_round_s_end(sshd, tmp_path):
    """A wedged node holds its round for the connect timeout (and, one login at a time, the round's
    only slot); the node that began failing early in that round is checked again a quarter of an
    interval after its own failure, round or not."""
    silent, health = await _refusing_and_wedged(sshd, tmp_path, timeout_s=6.0, interval_s=4, concurrency=1)
    published: asyncio.Queue = asyncio.Queue()

    async def publish(event) -> None:
        published.put_nowait((event.node_id, event.failures))

    loop = asyncio.create_task(health.loop(publish)())
    try:
        seen = [await asyncio.wait_for(published.get(), 10) for _ in range(3)]
        # the second check of the refusing node (1 s after its first) comes before the wedged node's first answer (6 s)
        assert seen == [("refusing", 1), ("refusing", 2), ("wedged", 1)]
    finally:
        loop.cancel()
        silent.close()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_node_that_begins_failing_is_checked_again_alone_a_quarter_of_an_interval_on(sshd, tmp_path):
    """Its incident waits for two failures in a row: the second comes from a check of that node
    alone, not from the next round over the whole inventory (which may take the interval itself)."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "nodes:\n"
        f"  ok-node: {{host: 127.0.0.1, port: {sshd.port}, user: root}}\n"
        f"  refusing: {{host: 127.0.0.1, port: {_closed_port()}, user: root}}\n"
    )
    executor = SshExecutor(inventory=inventory, known_hosts=sshd.known_hosts, client_key=sshd.client_key, connect_timeout_s=2.0,
                           command_timeout_s=2.0)
    health = SshHealth(executor, inventory, interval_s=8, concurrency=4)
    checked: list[str] = []
    login = executor.check

    async def counted(node: str) -> None:
        checked.append(node)
        await login(node)

    executor.check = counted
    failures = asyncio.Queue()

    async def publish(event) -> None:
        if not event.reachable:
            failures.put_nowait((asyncio.get_running_loop().time(), event.failures))

    loop = asyncio.create_task(health.loop(publish)())
    try:
        first_at, first = await asyncio.wait_for(failures.get(), 10)
        second_at, second = await asyncio.wait_for(failures.get(), 7)  # a round apart, it would be 8 s and more
        assert (first, second) == (1, 2)
        assert 2 <= second_at - first_at < 8
        assert sorted(checked) == ["ok-node", "refusing", "refusing"]  # the reachable node waits for the next round
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_node_that_leaves_the_inventory_during_its_round_is_no_failure(sshd, tmp_path):
    """A worker ended and removed from the inventory while a round that began with it runs: its
    check finds it gone from the inventory, which is no failed login to publish, and no check again."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes:\n" + "".join(f"  {n}: {{host: 127.0.0.1, port: {sshd.port}, user: root}}\n" for n in ("kept", "ended")))
    executor = SshExecutor(inventory=inventory, known_hosts=sshd.known_hosts, client_key=sshd.client_key, connect_timeout_s=2.0,
                           command_timeout_s=2.0)
    health = SshHealth(executor, inventory, interval_s=4, concurrency=4)
    login = executor.check

    async def ended_meanwhile(node: str) -> None:
        if node == "ended":  # terminated after the round read the inventory
            inventory.write_text(f"nodes:\n  kept: {{host: 127.0.0.1, port: {sshd.port}, user: root}}\n")
        await login(node)

    executor.check = ended_meanwhile
    published = []

    async def publish(event) -> None:
        published.append((event.node_id, event.reachable, event.cause))

    await health.check_all(publish, again=True)
    await asyncio.sleep(1.5)  # a check again would come a quarter interval (1 s) on
    assert published == [("kept", True, "ok")]
    assert set(health.states) == {"kept"}


async def test_a_timeout_measured_while_the_remediators_own_loop_lagged_is_not_counted(sshd, tmp_path):
    """A starved remediator (its loop blocked by a GC pause or a neighbour's CPU) cannot tell a node
    that did not answer from an answer that waited for its loop: that check counts neither way and
    the node keeps its state; a refusal is no timeout and is still said; once the loop keeps up, the
    wedged node's timeout counts."""
    silent, health = await _refusing_and_wedged(sshd, tmp_path, timeout_s=1.0, interval_s=60, concurrency=4)
    health._loop_lag = lag = LoopLag(every_s=0.05)
    lagging = asyncio.create_task(lag.run())
    published = []

    async def publish(event) -> None:
        published.append(event)

    async def starve() -> None:
        await asyncio.sleep(0.2)
        time.sleep(LAGGING_AFTER_S + 0.2)  # the loop runs nothing meanwhile

    try:
        await asyncio.gather(health.check_all(publish), starve())
        assert [(e.node_id, e.cause) for e in published] == [("refusing", "refused")]
        assert "wedged" not in health.states
        await asyncio.sleep(0.1)
        await health.check_all(publish)
        assert {e.node_id: e.cause for e in published[1:]} == {"refusing": "refused", "wedged": "timeout"}
        assert {n: s.failures for n, s in health.states.items()} == {"refusing": 2, "wedged": 1}
    finally:
        lagging.cancel()
        silent.close()
