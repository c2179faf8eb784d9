"""The simulated node agents (bench/fleet/sim.py): what workers/agent.py carries out from its
queue (start and kill replicas and generators, kill a node's stages) behind the same fence, the
node's heartbeat, usage and warm spares, and the faults the schedule injects into hosts and
processes. A side of FleetSim: it works on the simulator's process table and counters."""

from __future__ import annotations

import json
import random
import time
from contextlib import nullcontext

import redis

from bench.fleet.sim_model import (
    NODE_HEARTBEAT_TTL_S,
    RECENT_S,
    SIGNAL_CODES,
    Agent,
    QueueEvent,
    Replica,
    command_named,
    decode_message,
    expired,
    job_named,
)
from infra import keys as control_keys
from infra import tasks
from infra.node_metrics import NodeUsage
from infra.processes import STAGE_MODULE, cmdline_arg
from infra.queues import node_queue
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import LEASE_FIELD, Verdict, carrying_out
from spark_runtime.generators import generator_replica_id, make_payload_factory
from spark_runtime.jobdef import resolve_topology
from spark_runtime.stage import (
    build_parser,
    parse_params,
)
from spark_runtime.topology import OUT_CHANNEL, RESULTS_CHANNEL, stage_spec, with_params


class AgentSide:
    """What FleetSim's agents do; FleetSim sets up the state these methods share."""

    def _start(self, node: str, args: list[str], replica_id: str, job: str, warm: bool) -> str:
        """workers.agent.start_replica for a stage of `job`; returns what it did (another job's
        process of the same replica id is another replica)."""
        if (
            cmdline_arg(args, "--job") != job
            or cmdline_arg(args, "--replica-id") != replica_id
            or cmdline_arg(args, "--node") != node
        ):
            self.counts["refused_start"] += 1
            return "refused"
        if self._find(node, replica_id, job):
            self.counts["start_of_running"] += 1
            return "running already"
        parsed, _unknown = build_parser().parse_known_args(args)
        now = time.time()
        agent = self.agents[node]
        took_spare, warm_left = False, 0.0
        if warm:
            idle = sorted(s for s, e in agent.spares.items() if e["state"] == "idle")
            warming = sorted(s for s, e in agent.spares.items() if e["state"] == "starting")
            for spare_id in idle + warming:
                entry = agent.spares.pop(spare_id)
                took_spare = True
                self._spare_taken(node, spare_id)
                if entry["state"] == "starting":
                    warm_left = max(0.0, entry["since"] + self.timing.spare_warmup_s - now)
                else:
                    warm_left = 0.0
                break
        base = self.timing.warm_start_s + warm_left if took_spare else self.timing.cold_start_s
        jitter = 1 + self.rng.uniform(-self.timing.start_jitter, self.timing.start_jitter)
        trigger = parsed.trigger_seconds or 0.5
        topology = parsed.topology
        try:
            spec = with_params(resolve_topology(topology), parse_params(parsed.param))
            operators = [o for o in parsed.operators.split(",") if o]
            stage = stage_spec(spec, parsed.stage, operators, job=parsed.job)
            segments = max(1, len(stage.segments))
            final = bool(set(stage.outputs) & {RESULTS_CHANNEL, OUT_CHANNEL})
        except (KeyError, ValueError):
            segments, final = 1, False
        pid = next(self.pids)
        replica = Replica(
            pid=pid,
            job=job,
            replica_id=replica_id,
            node=node,
            stage=parsed.stage,
            role=parsed.role,
            started_at=now + self.timing.boot_s,
            up_at=now + self.timing.boot_s + base * jitter,
            trigger_s=trigger,
            segments=segments,
            final=final,
            cpu_priorities=parsed.cpu_priorities,
            topology=topology,
            successor=parsed.successor,
        )
        replica.info = {
            "replica": replica_id,
            "stage": parsed.stage,
            "role": parsed.role,
            "pid": pid,
            "node": node,
            "host": f"sim-{node}",
            "state": "starting",
            "epoch": None,
            "started_at": replica.started_at,
            "nice": 0,
        }
        if parsed.seed_from:
            replica.info["seeded_batches"] = 1
        replica.next_hb = replica.started_at
        elsewhere = sorted(p.node for p in self.by_job_id.get((job, replica_id), {}).values())
        if elsewhere:
            # One replica id of one job would run twice: both would write as that replica.
            self.duplicates.append(
                {"at": now, "job": job, "replica_id": replica_id, "nodes": [*elsewhere, node]}
            )
        self._add(replica)
        self.stages_seen.add((replica.job, replica.stage))
        self.counts["started_warm" if took_spare else "started_cold"] += 1
        return "started"

    def _start_generator(self, node: str, job: str, topology: str, rate: float, seed: int) -> None:
        """workers.agent.start_generator: a running one is left alone."""
        replica_id = generator_replica_id(job)
        if self._find(node, replica_id, job):
            return
        if self.by_job_id.get((job, replica_id)):
            self.counts["generator_on_two_nodes"] += 1
        now = time.time()
        pid = next(self.pids)
        try:
            payload = make_payload_factory(topology, random.Random(seed), 1.0)
        except (KeyError, ValueError):
            payload = None
        self._add(Replica(
            pid=pid, job=job, replica_id=replica_id, node=node, stage="", role="",
            started_at=now, up_at=now, trigger_s=1.0, generator=True, topology=topology,
            state="running", payload=payload, next_batch=now + 1.0,
        ))  # fmt: skip
        self.counts["generators_started"] += 1

    def _jobs_using(self, node: str, replica_id: str, now: float) -> set[str]:
        """Jobs whose process of `replica_id` runs on `node` or ended there within RECENT_S."""
        jobs = {p.job for p in self._find(node, replica_id)}
        ended = self.ended.get((node, replica_id), [])
        return jobs | {j for at, j, _ in ended if now - at < RECENT_S}

    def _kill(
        self, node: str, replica_id: str, signal_name: str, now: float, job: str | None
    ) -> bool:
        """workers.agent.kill_replica: the process of replica `replica_id` of `job` on `node`.

        A kill naming no job (`job` None: an older controller's message) takes the oldest
        process of that id, of whichever job, as the agent's fallback does; when several jobs
        used that id on the node lately it may be another job's, and is counted a collision."""
        if job is None:
            self.counts["kill_without_job"] += 1
            if len(self._jobs_using(node, replica_id, now)) > 1:
                self.collisions["kill_replica"] += 1
        found = self._find(node, replica_id, job)
        if not found:
            return False
        self._end(found[0], SIGNAL_CODES.get(signal_name, -9), "kill_replica")
        return True

    def _kill_node_stages(self, node: str, job: str | None) -> None:
        """workers.node.faults.kill_node: every stage process of the node (not the generators)."""
        for replica in self.live_on(node):
            if not replica.generator and job in (None, replica.job):
                self._end(replica, -9, "kill_node")

    def handle_message(
        self, node: str, raw, popped_at: float, sent_at: float | None = None, client=None
    ) -> None:
        """One Celery message popped from `node`'s queue (`sent_at`: when it landed there).
        A controller's command (one carrying its lease token) is judged by the agent's fence
        first, as workers/agent.py does (`client`: a Redis connection decoding responses, for
        the lease read); a refused one is not carried out."""
        task, args, kwargs, headers = decode_message(raw)
        late = expired(headers, popped_at)
        token = kwargs.get(LEASE_FIELD)
        about = job_named(task, args, kwargs)
        what = command_named(task, args)
        # A worker drops an expired message before its task runs: no fence check then. A
        # command carried out holds its job's lease still until it is audited.
        judged = token is not None and not late and bool(about)
        fence_check = (
            carrying_out(client, self.agent_fences[node], about, token, f"agent {node}", what)
            if judged
            else nullcontext(Verdict(True))
        )
        with fence_check as verdict:
            if judged:
                self.count(2)  # the lease read with the mark, the mark cleared
            refused = not verdict.accepted
            if refused:
                self._refused(about, what, token, verdict.reason, f"agent {node}")
            self._carry_out(node, task, args, kwargs, popped_at, sent_at, late, refused)
            if judged and not refused:
                self._audit(client, about, token, what, f"agent {node}")

    def _carry_out(self, node, task, args, kwargs, popped_at, sent_at, late, refused) -> None:
        """Carry one decoded message out (unless it expired or was refused) as workers/agent.py's
        task would, and log it with what it named."""
        carry_out = not late and not refused
        job = stage = replica_id = ""
        candidates: set[tuple[str, str]] = set()
        with self.lock:
            if task == tasks.START_REPLICA.name:
                module, stage_args, replica_id, job = args[:4]
                stage = cmdline_arg(stage_args, "--stage") or ""
                if carry_out and module == STAGE_MODULE:
                    self._start(node, stage_args, replica_id, job, kwargs.get("warm", False))
                elif carry_out:
                    self.counts["refused_start"] += 1
            elif task == tasks.START_GENERATOR.name:
                job = args[0]
                replica_id = generator_replica_id(job)
                if carry_out:
                    rate = args[2] if len(args) > 2 else 1.0
                    seed = args[3] if len(args) > 3 else 0
                    self._start_generator(node, job, args[1], rate, seed)
            elif task == tasks.KILL_REPLICA.name:
                replica_id = args[0]
                signal_name = args[1] if len(args) > 1 else kwargs.get("signal_name", "SIGKILL")
                named = (args[2] if len(args) > 2 else kwargs.get("job_key")) or None
                found = self._find(node, replica_id, named)
                if found:
                    job, stage = found[0].job, found[0].stage
                candidates = {(p.job, p.stage) for p in found}
                candidates |= {
                    (j, st)
                    for at, j, st in self.ended.get((node, replica_id), [])
                    if popped_at - at < RECENT_S and named in (None, j)
                }
                if named is not None:
                    job = named
                    candidates = candidates or {(named, "")}
                if carry_out:
                    self._kill(node, replica_id, signal_name, popped_at, named)
            elif task == tasks.KILL_NODE.name:
                job = (args[0] if args else kwargs.get("job_key")) or ""
                if carry_out:
                    self._kill_node_stages(node, job or None)
            else:
                self.counts[f"unhandled {task}"] += 1
            if late:
                self.counts["expired_messages"] += 1
            self.queue_log.append(
                QueueEvent(popped_at, node, task, job, stage, replica_id, late,
                           tuple(sorted(candidates)), sent_at, refused)
            )  # fmt: skip

    def _queue_loop(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        fence_client = self._client()
        while not self.stopping.is_set():
            with self.lock:
                queues = {node_queue(a.name): a.name for a in self.agents.values() if a.up}
            if not queues:
                time.sleep(0.2)
                continue
            popped = client.brpop(list(queues), timeout=0.5)
            self.count()
            if popped is None:
                continue
            queue, raw = popped
            now = time.time()
            node = queues[queue.decode()]
            self.handle_message(node, raw, now, self._push_time(node), fence_client)

    def _push_time(self, node: str) -> float | None:
        """When the message just popped from `node`'s queue was pushed: the oldest push heard
        and not yet paired (BRPOP takes the oldest message; its keyspace event may still be on
        its way to the control thread)."""
        with self.pushed_cv:
            self.pushed_cv.wait_for(lambda: self.pushed[node], timeout=0.2)
            if not self.pushed[node]:
                self.counts["pops_without_push_event"] += 1
                return None
            return self.pushed[node].popleft()

    def _publish_node(self, pipe, agent: Agent, now: float) -> None:
        """workers.node.loops.publish_forever: heartbeat, usage sample, replica activity, spares."""
        live = list(self.by_node[agent.name].values())
        stages = [p for p in live if p.state in ("starting", "running")]
        self._reconcile_spares(pipe, agent, now)
        idle = sum(1 for e in agent.spares.values() if e["state"] == "idle")
        cpu_total, mem_total = self.timing.node_cpu, self.timing.node_mem_mb
        cpu_used = min(cpu_total, 0.3 + self.timing.replica_cpu * len(stages))
        processes = len(live) + len(agent.spares)
        mem_used = min(mem_total, 2048 + self.timing.replica_rss_mb * processes)
        usage = NodeUsage(
            cpu_total=cpu_total, cpu_used=round(cpu_used, 3), mem_total=mem_total,
            mem_used=round(mem_used, 1), disk_throughput=5.0, disk_max_throughput=200.0,
            bw_used=10.0, bw_total=1000.0, at=now, processes=len(live),
        ).to_dict()  # fmt: skip
        payload = json.dumps({**usage, "spares": idle})
        pipe.set(control_keys.node_heartbeat(agent.name), payload, ex=NODE_HEARTBEAT_TTL_S)
        pipe.xadd(
            control_keys.node_metrics(agent.name),
            {"sample": payload},
            maxlen=control_keys.NODE_METRICS_MAXLEN,
            approximate=True,
        )
        by_job: dict[str, dict[str, str]] = {}
        for replica in live:
            share = self.timing.replica_cpu if replica.state == "running" else 0.9
            entry = {
                "cpu": share, "cpu_avg": share, "rss_mb": self.timing.replica_rss_mb,
                "busy": True, "at": now,
            }  # fmt: skip
            by_job.setdefault(replica.job, {})[replica.replica_id] = json.dumps(entry)
        for job, entries in by_job.items():
            pipe.hset(control_keys.replica_activity(job), mapping=entries)
            pipe.expire(control_keys.replica_activity(job), control_keys.ACTIVITY_TTL_S)

    def _read_spare_targets(self, client) -> None:
        with self.lock:
            names = [a.name for a in self.agents.values() if a.up]
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.get(data_keys.spares_wanted(name))
        pipe.exists(data_keys.spare_refill_hold())
        self.count(len(names) + 1)
        *wanted, held = pipe.execute()
        with self.lock:
            for name, value in zip(names, wanted, strict=True):
                self.agents[name].wanted_spares = int(value or 0)
                self.agents[name].refill_held = bool(held)

    def _reconcile_spares(self, pipe, agent: Agent, now: float) -> None:
        """workers.node.spares.reconcile_spares: one spare more or fewer per round; a spare warms up
        in spare_warmup_s."""
        for spare_id, entry in agent.spares.items():
            if entry["state"] == "starting" and now - entry["since"] >= self.timing.spare_warmup_s:
                entry["state"] = "idle"
                pipe.hset(data_keys.spares(agent.name), spare_id, json.dumps(entry))
        if len(agent.spares) < agent.wanted_spares and not agent.refill_held:
            warming = any(e["state"] == "starting" for e in agent.spares.values())
            if not warming:
                spare_id = f"spare-{agent.name}-{int(now * 1000)}"
                entry = {"pid": next(self.pids), "state": "starting", "since": now}
                agent.spares[spare_id] = entry
                pipe.hset(data_keys.spares(agent.name), spare_id, json.dumps(entry))
        elif len(agent.spares) > agent.wanted_spares:
            extra = sorted(agent.spares)[-1]
            del agent.spares[extra]
            pipe.hdel(data_keys.spares(agent.name), extra)

    def _spare_taken(self, node: str, spare_id: str) -> None:
        """workers.node.spares.hand_to_spare: the spare's entry goes and refills are held (written
        with the next tick)."""
        self.spares_taken.append((node, spare_id))

    def kill_process(self, pid: int) -> Replica | None:
        """A stage process dies (SIGKILL, out of the blue); its agent reports the exit."""
        with self.lock:
            replica = self.processes.get(pid)
            if replica is None or not self.agents[replica.node].up:
                return None
            self._end(replica, -9, "fault")
            return replica

    def kill_node(self, node: str, down_s: float) -> list[Replica]:
        """The host goes down: every process on it dies with its agent (no exit is reported),
        its heartbeats stop and its queue is not read, for `down_s`; then the agent comes back
        with nothing running."""
        with self.lock:
            agent = self.agents[node]
            victims = list(self.by_node[node].values())
            for replica in victims:
                self._end(replica, -9, "node", report=False)
            self.pending_exits = [e for e in self.pending_exits if e[1].node != node]
            agent.up = False
            agent.down_until = time.time() + down_s
            agent.spares.clear()
            # Its agent died with it: the one that comes back remembers nothing.
            self.agent_fences.pop(node, None)
        client = self._client()
        client.delete(data_keys.spares(node))
        self.count()
        return victims

    def _wake_nodes(self, now: float) -> None:
        for agent in self.agents.values():
            if not agent.up and agent.down_until is not None and now >= agent.down_until:
                agent.up, agent.down_until, agent.next_publish = True, None, 0.0
