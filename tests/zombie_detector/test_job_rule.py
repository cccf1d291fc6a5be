"""job_hung: the ranks of one job across four nodes judged together. A hung collective is one
incident on the node that stopped (its rank gone, its samples stopped, its GPU's fault), never a
zombie per rank; a checkpoint, a job that ends and a job on one node are not it."""

from __future__ import annotations

from gpumedic_events import (
    ActionRequested,
    ContainerExited,
    CpuPressure,
    DrainNode,
    GpuLost,
    GpuProcess,
    GpuSample,
    HostSample,
    IncidentEscalated,
    IncidentKind,
    IncidentOpened,
    IncidentUpdated,
    JobTag,
    NcclRasAnswer,
    NodeSampled,
    RasRank,
    RestartJob,
    StopJob,
    UndrainNode,
)
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import Actions, FleetPolicy, JobHungPolicy, JobRestart, Kinds, RestartJobPolicy, Step
from tests.zombie_detector.test_rules import Detector, at, sample, succeeded
from zombie_detector.rules.job import job_key

POLICY = Policy(fleet=FleetPolicy(hold_s=0))
NODES = ("n1", "n2", "n3", "n4")
RUN = "torchelastic:llama-ft-0412"


def rank(node: int, local: int, *, job: str = RUN, wrote: int | None = None, nodes: int | None = 4) -> GpuProcess:
    r = node * 2 + local
    tag = JobTag(id=job, rank=r, world_size=2 * nodes if nodes else None, local_world_size=2, nodes=nodes)
    return GpuProcess(pid=5000 + r, start_ticks=900 + r, command="python train.py", container_exists=True, write_bytes=wrote, job=tag)


def node_sample(i: int, utils=(97, 96), *, ranks=True, lost: int | None = None, wrote: int | None = None, **kw) -> NodeSampled:
    gpus = tuple(
        GpuSample(index=g, utilization_gpu_pct=None if g == lost else utils[g], lost=g == lost, memory_used_mib=70_000 if ranks else 0,
                  processes=(rank(i, g, wrote=wrote if i == 0 and g == 0 else None, **kw),) if ranks else ())
        for g in (0, 1)
    )
    return sample(NODES[i], gpus=gpus).model_copy(update={"jobs": sample().jobs.model_copy(update={"output_growing": False})})


def run(d: Detector, start: int, until: int, shape=lambda i, s: node_sample(i), nodes=range(4)) -> None:
    for s in range(start, until, 5):
        for i in nodes:
            if (one := shape(i, s)) is not None:
                d.feed(one, s + i * 0.5)
        d.tick(s + 3)


def idle_but(i: int, s: float) -> NodeSampled:
    return node_sample(i, (0, 1))


def kinds(d: Detector) -> list[tuple[str, str]]:
    return sorted((e.kind.value, e.node_id) for e in d.opened())


def test_a_job_hung_by_one_lost_gpu_is_one_incident_on_its_node_and_no_zombie_on_the_ranks_that_wait():
    d = Detector(POLICY)
    run(d, 0, 60)
    d.feed(GpuLost(source="node-sampler", node_id="n3", gpu_index=1, reason="NVML: GPU is lost"), 61)
    run(d, 65, 800, lambda i, s: node_sample(i, (0, 0), lost=1 if i == 2 else None))
    assert kinds(d) == [("gpu_lost", "n3"), ("job_hung", "n3")]
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.fingerprint == f"n3/job_hung/node/{job_key(RUN)}"
    assert hung.summary.startswith(f"job {RUN}: 7 of 7 ranks idle for 30")
    assert "the node that stopped: GPU 1 of n3, where rank 5 ran, fell off the bus" in hung.summary
    assert hung.evidence["culprit"] == "n3" and hung.evidence["cause"] == "gpu_lost" and hung.evidence["nodes"] == 4
    drains = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, DrainNode)]
    assert {e.node_id for e in drains} == {"n3"}  # the node that stopped, and only it


def test_a_rank_that_nvml_no_longer_lists_on_its_lost_gpu_is_not_taken_for_one_that_exited():
    d = Detector(POLICY)

    def writing(i: int, s: float) -> NodeSampled:  # every rank computes and writes until its GPU is lost
        base = node_sample(i)
        return base.model_copy(update={"gpus": tuple(g.model_copy(update={"processes": tuple(
            p.model_copy(update={"write_bytes": 1000 * int(s)}) for p in g.processes)}) for g in base.gpus)})

    run(d, 0, 60, writing)
    gone = lambda i, s: node_sample(i, (0, 0), lost=1 if i == 2 else None).model_copy(  # noqa: E731
        update={"gpus": tuple(g.model_copy(update={"processes": ()}) if g.lost else g for g in node_sample(i, (0, 0), lost=1 if i == 2 else None).gpus)})
    run(d, 65, 800, gone)
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.node_id == "n3" and hung.evidence["cause"] == "gpu_lost" and hung.evidence["ranks_seen"] == 8


def test_ranks_that_exited_on_one_node_name_it_while_the_rest_wait():
    d = Detector(POLICY)
    run(d, 0, 30)
    run(d, 30, 400, lambda i, s: node_sample(i, (0, 0), ranks=i != 1))
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.node_id == "n2" and hung.evidence["cause"] == "rank_exited"
    assert "rank(s) 2 3 exited on n2" in hung.summary and hung.evidence["ranks_idle"] == 6
    assert d.opened(IncidentKind.ZOMBIE_JOB) == []


def test_a_node_that_stopped_sampling_is_named_and_the_job_working_again_resolves_it():
    d = Detector(POLICY)
    run(d, 0, 30)
    run(d, 30, 400, lambda i, s: idle_but(i, s) if i != 3 else None)
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.node_id == "n4" and hung.evidence["cause"] == "node_stopped_sampling"
    (drain,) = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, DrainNode)]
    succeeded(d, drain, 401)
    (escalated,) = [e for e in d.events if isinstance(e, IncidentEscalated) and e.kind is IncidentKind.JOB_HUNG]
    assert "n4 is drained" in escalated.reason  # then a person restarts the job
    run(d, 405, 600, lambda i, s: node_sample(i, (0, 0), ranks=False) if i == 3 else node_sample(i))  # restarted without n4
    undrains = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, UndrainNode)]
    assert [e.node_id for e in undrains] == ["n4"]  # the job works again: n4 validates and comes back


def test_a_hang_with_no_node_known_to_have_stopped_goes_to_a_person_after_another_window_and_drains_nothing():
    d = Detector(POLICY)
    run(d, 0, 580, idle_but)
    assert d.opened() == []  # a cause may yet show itself
    run(d, 580, 700, idle_but)
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.node_id == "n1" and hung.evidence["culprit"] is None
    (escalated,) = [e for e in d.events if isinstance(e, IncidentEscalated)]
    assert "no node of the job is known to have stopped" in escalated.reason
    assert not [e for e in d.events if isinstance(e, ActionRequested)]


def test_a_busy_node_whose_samples_come_in_bursts_has_not_stopped_sampling():
    """A job's node whose CPUs its data loaders take: its sampler is late and pressed, and what it
    sends waits in its client and comes four samples at once, 20 s apart. That node has not stopped
    sampling: a hang nothing names goes to a person, and no healthy node is drained for it."""
    d = Detector(POLICY)
    for s in range(0, 700, 5):
        for i in (0, 2, 3):
            d.feed(idle_but(i, s), s + i * 0.5)
        if s % 20 == 15:  # the burst: four samples taken 5 s apart, each saying it was late, its CPUs pressed
            for taken in range(s - 15, s + 1, 5):
                late = idle_but(1, taken).model_copy(update={
                    "occurred_at": at(taken), "due_at": at(taken - 3), "host": HostSample(cpu_pressure=CpuPressure(some_avg10_pct=93.0))})
                d.feed(late, s + 0.5)
        d.tick(s + 3)
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.evidence["culprit"] is None and hung.evidence["cause"] is None
    assert not [e for e in d.events if isinstance(e, ActionRequested)]


def heard(answer_on: dict[int, NcclRasAnswer]):
    """Every rank idles; each node in `answer_on` carries what NCCL's RAS told its sampler."""
    return lambda i, s: idle_but(i, s).model_copy(update={"nccl_ras": answer_on.get(i)}) if s >= 150 else idle_but(i, s)


def ras(*missing: RasRank, error: str | None = None) -> NcclRasAnswer:
    return NcclRasAnswer(asked_at="2026-11-28T09:00:00Z", nccl_version=None if error else "2.29.1", output=None if error else "json",
                         missing=missing, missing_count=len(missing), error=error)


def test_a_rank_that_stopped_without_exiting_is_named_by_nccl_ras_and_only_its_node_drained():
    d = Detector(POLICY)
    wedged = RasRank(rank=5, communicator_size=8, host="10.0.0.3", pid=4242, gpu=1)
    timed_out = ras(error="NCCL RAS on 127.0.0.1:28028 did not answer within 15s")  # n3's own RAS is in the stopped process
    run(d, 0, 400, heard({0: ras(wedged), 1: ras(wedged), 2: timed_out, 3: ras(wedged)}))
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.node_id == "n3" and hung.evidence["cause"] == "rank_unresponsive"
    assert "NCCL's RAS (2.29.1, asked on n1) finds rank 5 on n3 unresponsive (pid 4242, on 10.0.0.3, GPU 1)" in hung.summary
    # opened by 400 s: named once idle_for_s passed, without the second window an unnamed hang waits
    drains = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, DrainNode)]
    assert {e.node_id for e in drains} == {"n3"}


def test_what_is_known_of_the_node_ras_names_is_said_beside_it():
    d = Detector(POLICY)
    wedged = RasRank(rank=5, communicator_size=8, host="10.0.0.3", pid=4242, gpu=1)
    starved = HostSample(memory_total_mib=100_000, memory_available_mib=1_000)  # a rank stuck in the kernel for want of memory

    def shape(i: int, s: float) -> NodeSampled:
        sample = heard({0: ras(wedged)})(i, s)
        return sample.model_copy(update={"host": starved}) if i == 2 else sample

    run(d, 0, 400, shape)
    assert ("host_memory_pressure", "n3") in kinds(d)
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.node_id == "n3" and hung.summary.endswith("; n3 also has open host_memory_pressure")


def test_ras_that_reaches_every_rank_or_cannot_be_asked_names_nobody_and_says_so():
    for answers, said in (
        ({0: ras(), 1: ras()}, "NCCL's RAS reaches every rank (2 node(s) asked)"),
        ({0: ras(error="nothing listens on 127.0.0.1:28028: NCCL older than 2.24")}, "NCCL's RAS could not be asked: nothing listens"),
        ({}, "NCCL's RAS was not heard from"),
        # a rank missing from a pipeline stage's 2-rank communicator is not the job's world rank 5
        ({0: ras(RasRank(rank=5, communicator_size=2))}, "NCCL's RAS cannot reach 1 rank(s)"),
    ):
        d = Detector(POLICY)
        run(d, 0, 700, heard(answers))
        (hung,) = d.opened(IncidentKind.JOB_HUNG)
        assert hung.node_id == "n1" and hung.evidence["culprit"] is None
        (escalated,) = [e for e in d.events if isinstance(e, IncidentEscalated)]
        assert said in escalated.reason, escalated.reason
        assert not [e for e in d.events if isinstance(e, ActionRequested)]


def test_one_rank_that_died_among_its_nodes_siblings_names_its_node():
    d = Detector(POLICY)
    run(d, 0, 30)
    crashed = lambda i, s: node_sample(i, (0, 0)).model_copy(  # noqa: E731
        update={"gpus": node_sample(i, (0, 0)).gpus[:1] if i == 2 else node_sample(i, (0, 0)).gpus})
    run(d, 30, 400, crashed)
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    assert hung.node_id == "n3" and hung.evidence["cause"] == "rank_exited" and "rank(s) 5 exited on n3" in hung.summary


def test_a_checkpoint_written_while_every_rank_idles_is_no_hang():
    d = Detector(POLICY)
    run(d, 0, 900, lambda i, s: node_sample(i, (0, 0), wrote=1_000_000 * s))
    assert d.opened() == []


def test_ranks_that_all_finish_together_open_nothing_and_the_job_is_forgotten():
    d = Detector(POLICY)
    run(d, 0, 60)
    run(d, 60, 70, lambda i, s: idle_but(i, s) if s == 60 else node_sample(i, ranks=False))
    run(d, 70, 700, lambda i, s: node_sample(i, ranks=False))
    assert d.opened() == []
    assert d.logic.rules[0].jobs == {}


def test_a_rank_of_a_job_on_one_node_is_still_the_zombie_rules():
    d = Detector(POLICY)
    local = lambda i, s: node_sample(0, (0, 0), job="torchelastic:single", nodes=1) if i == 0 else None  # noqa: E731
    run(d, 0, 700, local)
    assert kinds(d) == [("zombie_job", "n1"), ("zombie_job", "n1")]


def test_a_job_seen_on_two_nodes_spans_them_though_its_launcher_gave_no_node_count():
    d = Detector(POLICY)
    mpi = lambda i, s: node_sample(i, (0, 0), job="rendezvous:10.0.0.1:6000", nodes=None) if i < 2 else None  # noqa: E731
    run(d, 0, 700, mpi)
    assert kinds(d) == [("job_hung", "n1")]


def test_with_stop_job_in_the_ladder_the_culprit_is_drained_then_every_rank_stopped_and_the_job_working_again_resolves_it():
    policy = Policy(fleet=FleetPolicy(hold_s=0), kinds=Kinds(job_hung=JobHungPolicy(
        ladder=(Step(action="drain_node"), Step(action="stop_job", verify_within_s=120)))))
    d = Detector(policy)
    run(d, 0, 60)
    run(d, 65, 400, lambda i, s: node_sample(i, (0, 0), lost=1 if i == 2 else None))
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    (drain,) = [e for e in d.events if isinstance(e, ActionRequested) and e.incident_id == hung.incident_id]
    assert drain.node_id == "n3" and isinstance(drain.operation, DrainNode)
    succeeded(d, drain, 401)
    run(d, 405, 480, lambda i, s: node_sample(i, (0, 0), lost=1 if i == 2 else None))  # drained, still hung: the next step
    (stop,) = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, StopJob)]
    op = stop.operation
    assert stop.node_id == "n3" and op.job == RUN and op.max_gpu_utilization_pct == 4 and op.grace_s == 10.0
    # every rank seen, but the one on n3's lost GPU (NVML no longer lists it to be checked against)
    assert sorted((r.node_id, r.gpu_index, r.pid) for r in op.ranks) == sorted(
        (NODES[i], g, 5000 + i * 2 + g) for i in range(4) for g in (0, 1) if (i, g) != (2, 1))
    assert all(r.start_ticks is not None and r.command == "python train.py" for r in op.ranks)
    # the stop's SIGTERM ends the ranks' containers: gpumedic's own doing, no container_died
    d.feed(ContainerExited(source="node-sampler", node_id="n1", container_id="c0ffee" * 4, name="rank-2", exit_code=143), 481)
    d.tick(481 + 30)
    assert d.opened(IncidentKind.CONTAINER_DIED) == []
    before = len(d.events)
    succeeded(d, stop, 481)
    # its launcher starts it again without n3 (its GPU 1 lost, its rank there beyond NVML's sight): the ranks work elsewhere
    run(d, 485, 700, lambda i, s: node_sample(i) if i != 2 else node_sample(i, (0, 0), ranks=False, lost=1))
    after = [e for e in d.events[before:] if getattr(e, "incident_id", None) == hung.incident_id]
    assert [type(e).__name__ for e in after] == ["IncidentUpdated"]  # fixed: n3 is validated before it comes back
    assert "ranks work again" in after[0].summary and "the node stays drained" in after[0].summary
    # the run under the same id idles a while (loading its checkpoint): judged afresh, not the fault come back
    run(d, 700, 800, lambda i, s: node_sample(i, (0, 0)) if i != 2 else node_sample(i, (0, 0), ranks=False, lost=1))
    assert not [e for e in d.events[before:] if isinstance(e, IncidentEscalated)]


def restarting_policy(on: str = "every_node") -> Policy:
    return Policy(
        fleet=FleetPolicy(hold_s=0),
        actions=Actions(restart_job=RestartJobPolicy(jobs={"train": JobRestart(unit="train.service")})),
        kinds=Kinds(job_hung=JobHungPolicy(restart_job="train", restart_on=on,
                                           ladder=(Step(action="drain_node"), Step(action="stop_job", verify_within_s=120)))),
    )


def stopped(d: Detector) -> tuple[IncidentOpened, ActionRequested]:
    """n3's GPU 1 lost hangs the job; the ladder drains n3 and asks for the stop."""
    run(d, 0, 60)
    run(d, 65, 400, lambda i, s: node_sample(i, (0, 0), lost=1 if i == 2 else None))
    (hung,) = d.opened(IncidentKind.JOB_HUNG)
    (drain,) = [e for e in d.events if isinstance(e, ActionRequested) and e.incident_id == hung.incident_id]
    succeeded(d, drain, 401)
    run(d, 405, 420, lambda i, s: node_sample(i, (0, 0), lost=1 if i == 2 else None))
    (stop,) = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, StopJob)]
    return hung, stop


def gone(i: int, s: float) -> NodeSampled:
    """No rank anywhere; n3's GPU 1 still off the bus (its rank there beyond NVML's sight)."""
    return node_sample(i, (0, 0), ranks=False, lost=1 if i == 2 else None)


def test_with_a_restart_in_the_policy_the_stopped_job_starts_again_on_its_other_nodes_then_the_culprit_is_validated():
    d = Detector(restarting_policy())
    hung, stop = stopped(d)
    # the ranks end while the stop's answer is awaited (a clear then is not heard): the rule says it again
    run(d, 425, 440, gone)
    assert not [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, RestartJob)]
    succeeded(d, stop, 441)
    d.tick(442)
    (restart,) = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, RestartJob)]
    assert restart.node_id == "n3" and restart.operation == RestartJob(job="train", nodes=("n1", "n2", "n4"))
    assert "no rank left on any node" in restart.reason and "restart the job train on 3 node(s)" in restart.reason
    before = len(d.events)
    succeeded(d, restart, 445)
    (validating,) = [e for e in d.events[before:] if getattr(e, "incident_id", None) == hung.incident_id]
    assert isinstance(validating, IncidentUpdated) and "restarted" in validating.summary and "the node stays drained" in validating.summary
    # the job starts again under its id without n3, idle while it loads: a new run, judged afresh, not the fault back
    run(d, 450, 600, lambda i, s: node_sample(i, (0, 0)) if i != 2 else gone(i, s))
    run(d, 600, 700, lambda i, s: node_sample(i) if i != 2 else gone(i, s))
    assert not [e for e in d.events[before:] if isinstance(e, IncidentEscalated)]
    assert kinds(d) == [("gpu_lost", "n3"), ("job_hung", "n3")]


def test_the_stopped_ranks_exits_a_busy_bus_delivers_after_the_incident_moved_on_are_still_the_stops_doing():
    """A hung job's stop ends its ranks on every node of the job; on a busy day their containers'
    exits (143) arrive after the stop was answered and the incident moved on. By the nodes' clocks
    they died while the stop ran: gpumedic's own doing, no container_died on any healthy host (the
    busy mixed scenario opened 41, one per rank). A death after the stop is a death of its own."""
    d = Detector(restarting_policy())
    hung, stop = stopped(d)
    died = at(421)
    succeeded(d, stop, 423)
    run(d, 425, 440, gone)
    assert any(isinstance(e, ActionRequested) and isinstance(e.operation, RestartJob) for e in d.events)  # moved on
    for i, node in enumerate(("n1", "n2", "n4")):
        d.feed(ContainerExited(source="node-sampler", node_id=node, container_id=f"{i:x}" * 64, name=f"rank-{i}", exit_code=143,
                               finished_at=died, occurred_at=died), 600)
    d.tick(640)
    assert d.opened(IncidentKind.CONTAINER_DIED) == []
    later = at(700)
    d.feed(ContainerExited(source="node-sampler", node_id="n1", container_id="e" * 64, name="rank-9", exit_code=143,
                           finished_at=later, occurred_at=later), 700)
    d.tick(740)
    assert [(e.node_id, e.diagnosis.cause) for e in d.opened(IncidentKind.CONTAINER_DIED)] == [("n1", "sigterm")]


def test_a_job_started_by_one_command_restarts_once_on_its_lowest_rank_but_never_on_the_node_that_stopped():
    d = Detector(restarting_policy("first_node"))
    _, stop = stopped(d)
    succeeded(d, stop, 421)
    run(d, 425, 440, gone)
    (restart,) = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, RestartJob)]
    assert restart.operation.nodes == ("n1",)


def test_a_job_that_runs_again_by_itself_after_the_stop_is_not_restarted():
    d = Detector(restarting_policy())
    hung, stop = stopped(d)
    succeeded(d, stop, 421)
    run(d, 425, 480, lambda i, s: node_sample(i) if i != 2 else gone(i, s))  # its own launcher was quicker
    assert not [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, RestartJob)]
    assert any(isinstance(e, IncidentUpdated) and e.incident_id == hung.incident_id and "ranks work again" in e.summary for e in d.events)


def test_the_node_that_stopped_being_free_does_not_verify_the_stop_while_ranks_run_elsewhere():
    d = Detector(restarting_policy())
    hung, stop = stopped(d)
    succeeded(d, stop, 421)
    before = len(d.events)
    # n3's GPUs are free at once (readiness would say so); the ranks elsewhere take a while to go
    run(d, 425, 445, lambda i, s: node_sample(i, (0, 0), ranks=False) if i == 2 else node_sample(i, (0, 0)))
    assert [e for e in d.events[before:] if getattr(e, "incident_id", None) == hung.incident_id] == []
    run(d, 445, 460, lambda i, s: node_sample(i, (0, 0), ranks=False))
    (restart,) = [e for e in d.events[before:] if isinstance(e, ActionRequested)]
    assert restart.operation == RestartJob(job="train", nodes=("n1", "n2", "n4"))


def test_the_stopped_job_ends_when_the_node_that_stopped_is_the_last_to_say_its_ranks_are_gone():
    # As above, but n3 (its GPU 1 off the bus) samples last after the stop: its rank on the lost GPU
    # cannot be seen to end, and the job has no other rank left, so it has ended there too.
    d = Detector(restarting_policy())
    hung, stop = stopped(d)
    succeeded(d, stop, 421)
    run(d, 425, 440, gone, nodes=(0, 1, 3, 2))
    d.tick(442)
    (restart,) = [e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, RestartJob)]
    assert restart.incident_id == hung.incident_id and restart.operation == RestartJob(job="train", nodes=("n1", "n2", "n4"))
