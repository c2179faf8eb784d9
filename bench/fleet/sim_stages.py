"""The simulated stage processes (bench/fleet/sim.py): the commands they obey from their
control lists behind the same fence as spark_runtime/stage.py (promote, demote, stop, trigger,
checkpoint interval, fault), their start, heartbeats, micro-batches and progress records, and
the generators' input. A side of FleetSim: it works on the simulator's process table."""

from __future__ import annotations

import contextlib
import json
import time

from bench.fleet.sim_model import (
    ControlEvent,
    Replica,
)
from infra.queues import node_queue
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import LEASE_FIELD, carrying_out
from spark_runtime.progress import ProgressRecord
from spark_runtime.stage import (
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_STOPPED,
    HEARTBEAT_TTL_MS,
    batch_every_s,
    wanted_nice,
)


class StageSide:
    """What FleetSim's stage processes do; FleetSim sets up the state these methods share."""

    def _control_loop(self) -> None:
        client = self._client()
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        prefix = f"__keyspace@{self.db}__:"
        pubsub.psubscribe(
            prefix + data_keys.make_key("*", "control", "*"), prefix + node_queue("*")
        )
        queue_prefix = node_queue("x")[:-1]
        next_sweep = time.time() + 5.0
        while not self.stopping.is_set():
            message = pubsub.get_message(timeout=0.5)
            now = time.time()
            if message is not None and message.get("data") in ("rpush", "lpush"):
                key = message["channel"][len(prefix) :]
                if key.startswith(queue_prefix):
                    with self.pushed_cv:
                        self.pushed[key[len(queue_prefix) :]].append(now)
                        self.pushed_cv.notify_all()
                else:
                    self._obey(client, key, now)
            if now >= next_sweep:
                # A command that landed while its replica was still starting waits in its list,
                # as for a real stage (it blocks on its list only once its queries run).
                next_sweep = now + 5.0
                with self.lock:
                    running = [
                        data_keys.control(p.job, p.replica_id)
                        for p in self.processes.values()
                        if p.state == "running" and not p.generator
                    ]
                pipe = client.pipeline(transaction=False)
                for key in running:
                    pipe.llen(key)
                self.count(len(running))
                for key, length in zip(running, pipe.execute(), strict=True):
                    if length:
                        self._obey(client, key, now)
        pubsub.close()

    def _replica_of_key(self, key: str) -> Replica | None:
        # backstop:{job}:control:{replica}
        parts = key.split(":")
        if len(parts) < 4 or parts[-2] != "control":
            return None
        job, replica_id = ":".join(parts[1:-2]), parts[-1]
        with self.lock:
            live = sorted(self.by_job_id.get((job, replica_id), {}).values(), key=lambda p: p.pid)
        return live[0] if live and not live[0].generator else None

    def _obey(self, client, key: str, at: float) -> None:
        replica = self._replica_of_key(key)
        if replica is None or replica.state != "running":
            return
        while True:
            raw = client.lpop(key)
            self.count()
            if raw is None:
                return
            try:
                command = json.loads(raw)
            except ValueError:
                continue
            token = command.get(LEASE_FIELD) if isinstance(command, dict) else None
            receiver = f"stage {replica.replica_id}"  # as spark_runtime/stage.py says it
            what = str(command.get("cmd")) if isinstance(command, dict) else "?"
            fence = self.stage_fences[replica.pid]
            # spark_runtime/stage.py: a controller's command is judged by the fence first, and
            # its lease stays put while it is carried out (and audited).
            with carrying_out(client, fence, replica.job, token, receiver, what) as verdict:
                if token is not None:
                    self.count(2)  # the lease read with the mark, the mark cleared
                if not verdict.accepted:
                    self._refused(replica.job, what, token, verdict.reason, receiver)
                    continue
                with self.lock:
                    self.control_log.append(
                        ControlEvent(at, replica.job, replica.replica_id, replica.stage, command)
                    )
                ended = self._command(client, replica, command)
                if token is not None:
                    self._audit(client, replica.job, token, what, receiver)
            if ended:
                return

    def _command(self, client, replica: Replica, command: dict) -> bool:
        """spark_runtime.stage.handle_command; True when the process ends."""
        cmd = command.get("cmd")
        with self.lock:
            if replica.state != "running":
                return True
            if cmd == "stop":
                replica.info["state"] = "stopped"
                self._publish_now(client, replica, delete_heartbeat=True)
                self._end(replica, EXIT_STOPPED, "stop")
                return True
            if cmd == "promote":
                if replica.role == "primary":
                    return False
                epoch = int(client.incr(data_keys.fence(replica.job, replica.stage)))
                self.count()
                key = (replica.job, replica.stage)
                self.fences[key] = max(self.fences.get(key, 0), epoch)
                replica.role = "primary"
                replica.epoch = epoch
                replica.info.update(
                    role="primary", state="running", epoch=epoch, promoted_at=time.time()
                )
                replica.info["batch_every_s"] = None
                self._renice(replica)
                self._publish_now(client, replica)
                self.counts["promotions"] += 1
                return False
            if cmd == "demote":
                # Carried out right after its next batch (`_batch`).
                if replica.role == "primary":
                    replica.demote_to = command.get("successor") or ""
                return False
            if cmd == "trigger":
                replica.trigger_s = float(command.get("seconds", replica.trigger_s))
                replica.info["trigger_seconds"] = replica.trigger_s
            elif cmd == "checkpoint_interval":
                replica.info.update(
                    checkpoint_interval_s=float(command.get("seconds", 0)),
                    interval_since=time.time(),
                    confs=command.get("confs") or {},
                )
            elif cmd == "fault" and command.get("kind") == "operator_exception":
                replica.fault_after = int(command.get("after_batches", 1))
            self._publish_now(client, replica)
        return False

    def _renice(self, replica: Replica) -> None:
        nice = wanted_nice(
            replica.cpu_priorities, replica.role, "running", replica.batches > 0, replica.successor
        )
        replica.info["nice"] = nice
        replica.info["batch_every_s"] = batch_every_s(nice)

    def _publish_now(self, client, replica: Replica, delete_heartbeat: bool = False) -> None:
        pipe = client.pipeline(transaction=False)
        self._beat(pipe, replica, time.time())
        if delete_heartbeat:
            pipe.delete(data_keys.heartbeat(replica.job, replica.replica_id))
            pipe.delete(data_keys.batch_pace(replica.job, replica.replica_id))
        self.count(len(pipe.command_stack))
        pipe.execute()

    def _beat(self, pipe, replica: Replica, now: float) -> None:
        """ReplicaState.publish: the replicas-hash entry, the heartbeat, the batch pace."""
        replica.info["updated"] = now
        payload = json.dumps(replica.info)
        pipe.hset(data_keys.replicas(replica.job), replica.replica_id, payload)
        pipe.set(data_keys.heartbeat(replica.job, replica.replica_id), payload, px=HEARTBEAT_TTL_MS)
        pace = data_keys.batch_pace(replica.job, replica.replica_id)
        if replica.info.get("batch_every_s") is not None:
            pipe.set(pace, replica.info["batch_every_s"], px=HEARTBEAT_TTL_MS)
        else:
            pipe.delete(pace)

    def _progress(self, pipe, replica: Replica, now: float) -> None:
        primary = replica.role == "primary"
        rows = max(1, int(25 * replica.trigger_s))
        for segment in range(replica.segments):
            final = replica.final and segment == replica.segments - 1
            written = rows if primary and final else 0
            record = ProgressRecord(
                replica=replica.replica_id,
                stage=replica.stage,
                role=replica.role,
                node=replica.node,
                query=f"{replica.job}.{replica.stage}.{replica.role}.{segment}",
                segment=str(segment),
                batch=replica.batches // replica.segments,
                at=now,
                input_rows=rows,
                input_rate=rows / replica.trigger_s,
                processed_rate=rows / 0.12,
                batch_ms=120.0,
                state_rows=200,
                state_memory_bytes=400_000,
                rows_out=rows,
                written=written,
                final=final,
                buffered=0 if primary else rows,
                latency_p50=0.6 if written else None,
                latency_p90=0.8 if written else None,
                latency_p99=1.0 if written else None,
            )
            pipe.xadd(
                data_keys.progress(replica.job),
                record.to_fields(),
                maxlen=data_keys.PROGRESS_MAXLEN,
                approximate=True,
            )

    def _up(self, replicas: list[Replica], client) -> None:
        """Replicas whose start is over: a primary takes a new fencing epoch (FencedWriter
        .acquire), every one reports `running`."""
        primaries = [r for r in replicas if r.role == "primary"]
        epochs = []
        if primaries:
            pipe = client.pipeline(transaction=False)
            for replica in primaries:
                pipe.incr(data_keys.fence(replica.job, replica.stage))
            self.count(len(primaries))
            epochs = pipe.execute()
        by_pid = {r.pid: int(e) for r, e in zip(primaries, epochs, strict=True)}
        with self.lock:
            for replica in replicas:
                if replica.pid not in self.processes:
                    continue
                epoch = by_pid.get(replica.pid, 0)
                if replica.role == "primary":
                    key = (replica.job, replica.stage)
                    self.fences[key] = max(self.fences.get(key, 0), epoch)
                replica.epoch = epoch
                replica.state = "running"
                replica.info.update(
                    state="running",
                    epoch=epoch,
                    checkpoint=f"var/checkpoints/{replica.job}/{replica.stage}/{replica.replica_id}",
                    spark_app=f"sim-{replica.job}-{replica.replica_id}",
                )
                replica.next_batch = time.time() + replica.trigger_s
                replica.next_hb = 0.0  # publish now
        # Commands sent while it started wait in its list: read them now.
        for replica in replicas:
            if replica.pid in self.processes:
                self._obey(client, data_keys.control(replica.job, replica.replica_id), time.time())

    def _batch(self, pipe, replica: Replica, now: float) -> bool:
        """One micro-batch of a running replica; True when it ended the process."""
        pace = replica.info.get("batch_every_s")
        replica.next_batch = now + (pace or replica.trigger_s)
        if replica.role == "primary":
            current = self.fences.get((replica.job, replica.stage), 0)
            if replica.epoch is not None and current > replica.epoch:
                replica.info.update(state="fenced", error="FencedError: FENCED stage epoch moved")
                self._beat(pipe, replica, now)
                pipe.delete(data_keys.heartbeat(replica.job, replica.replica_id))
                self._end(replica, EXIT_FENCED, "fenced")
                return True
        if replica.fault_after is not None:
            replica.fault_after -= 1
            if replica.fault_after <= 0:
                error = "InjectedFault: injected operator exception"
                replica.info.update(state="failed", error=error)
                self._beat(pipe, replica, now)
                pipe.delete(data_keys.heartbeat(replica.job, replica.replica_id))
                self._end(replica, EXIT_FAILED, "failed")
                return True
        first = replica.batches == 0
        replica.batches += replica.segments
        replica.info["batches"] = replica.batches
        if first:
            self._renice(replica)
            if replica.role != "primary":
                replica.info["lag_s"] = 0.0
        self._progress(pipe, replica, now)
        if replica.demote_to is not None:
            self._demoted(pipe, replica, now)
        return False

    def _demoted(self, pipe, replica: Replica, now: float) -> None:
        """spark_runtime.stage's `demote`, once the batch is written: a standby from now on,
        at full pace, passing the promotion on to its successor at once (no lease token: the
        stage's own command, not a controller's)."""
        successor, replica.demote_to = replica.demote_to, None
        replica.role = "standby"
        replica.info.update(
            role="standby", state="running", demoted_at=now, batch_every_s=None, lag_s=0.0
        )
        self._beat(pipe, replica, now)
        if successor:
            promote = json.dumps({"cmd": "promote", "from": replica.replica_id})
            pipe.rpush(data_keys.control(replica.job, successor), promote)
        self.counts["demotions"] += 1

    def _generate(self, pipe, replica: Replica, now: float) -> None:
        """A trickle of the job's input (one entry a second): the input stream exists and grows,
        as the controller's recovery measurement expects; the stages' load is simulated."""
        replica.seq += 1
        fields = {"id": f"{replica.job}-{replica.seq}", "ts": str(int(now * 1000))}
        if replica.payload is not None:
            with contextlib.suppress(TypeError, AttributeError):
                fields.update({k: str(v) for k, v in replica.payload(int(now * 1000)).items()})
        pipe.xadd(data_keys.input_stream(replica.job), fields, maxlen=1000, approximate=True)
