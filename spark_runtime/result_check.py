"""The old version's check of the new one's results during an upgrade (pure: no Spark, no Redis).

An upgrade declared result-preserving (a refactoring, a faster plan, a parameter that changes no
result) is held to it: after the hand-over the old version ("blue") keeps computing beside the
new one ("green") as its standby, and compares what it computes with what green writes, on the
keys both computed. A difference rolls the upgrade back (spark_runtime/upgrade.py).

What is comparable, per kind of sink:
- a hash of absolute values per key (upserts): a value is written with its version, an input
  offset: the offset of the input that changed it (built-in topologies), or the end of the
  batch that changed it (users' jobs). Green's value of a key at version V is the key's value
  after all input up to V; it is compared with blue's value where blue can vouch for it at V:
  blue's newest value of the key at a version up to V, as long as no input after it up to V
  could have changed it. That holds up to the end of blue's batch before the one with the key's
  next value (the input that changed it lies in that batch), up to just before the next
  value's own offset within one batch (built-in versions), and up to where blue has read for
  its newest value. So a key updated in every batch is compared where the two replicas' batches
  happen to agree, and every key once it stops changing (a closed window): its final value.
  Blue keeps the last few values of each key it computed since the hand-over.
- a stream appended once per key (a closed window): both records are final; compared field by
  field once both are there.
Streams without keys are not compared (a record of one replica has nothing to pair with).
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXAMPLES = 3  # differences kept to show in the rollback's reason
# Keys waiting for the other side, per kind: a bound on memory should green never write one.
PENDING_MAX = 100_000
# Values of a key blue keeps (newest last): green's value is compared with blue's in force at
# its version, which is one of the last few while green runs a few batches behind.
HISTORY = 8


@dataclass
class BlueValue:
    """One value blue computed for a key, and up to which input offset it is the key's value
    (`until`, inclusive unless `until_exclusive`; None: up to where blue has read)."""

    version: str
    value: str
    until: str | None = None
    until_exclusive: bool = False

    def holds_at(self, offset: str, blue_through: str) -> bool:
        if offset < self.version:
            return False
        if self.until is None:
            return offset <= blue_through
        return offset < self.until if self.until_exclusive else offset <= self.until


@dataclass
class ResultCheck:
    """Blue's running comparison of its results with green's (what its heartbeat reports)."""

    # False: the stage writes nothing to compare (a channel to another stage, a stream without
    # keys); the upgrade is then confirmed without a check, and says so.
    comparable: bool = True
    compared: int = 0
    differing: int = 0
    examples: list[str] = field(default_factory=list)
    blue_through: str = ""  # the highest input offset blue is known to have read
    # (sink, key) -> blue's last values of a key since the hand-over, oldest first
    blue_values: dict[tuple[str, str], list[BlueValue]] = field(default_factory=dict)
    # (sink, key) -> green's version last compared (each of green's values is compared once)
    compared_versions: dict[tuple[str, str], str] = field(default_factory=dict)
    look_up_from: int = 0  # where the next round-robin look-up of keys starts
    # (sink, key) -> fields: appended records of one side waiting for the other's
    blue_appended: dict[tuple[str, str], dict] = field(default_factory=dict)
    green_appended: dict[tuple[str, str], dict] = field(default_factory=dict)

    def note_blue_values(self, sink: str, rows: list, through: str) -> None:
        """Blue computed `rows` (objects with `field`, `value`, `version`) in a batch that read
        the input up to `through` (its end, or a lower bound of it)."""
        before = self.blue_through  # where blue's batches before this one ended
        for row in sorted(rows, key=lambda r: r.version):
            slot = (sink, row.field)
            history = self.blue_values.get(slot)
            if history is None:
                if len(self.blue_values) >= PENDING_MAX:
                    continue
                history = self.blue_values[slot] = []
            if history:
                previous = history[-1]
                if previous.version > before:  # the same batch: up to just before this one
                    previous.until, previous.until_exclusive = row.version, True
                else:  # an earlier batch: up to that batch's successors' end before this one
                    previous.until = before
            history.append(BlueValue(row.version, row.value))
            del history[:-HISTORY]
        self.blue_through = max(self.blue_through, through)

    def compare_values(self, sink: str, stored: dict[str, tuple[str, str] | None]) -> None:
        """Compare what the hash holds now with blue's values: `stored` maps a key to its
        (value, version) there (None: never written)."""
        for key, written in stored.items():
            slot = (sink, key)
            history = self.blue_values.get(slot)
            if not history or written is None:
                continue
            green_value, green_version = written
            if self.compared_versions.get(slot) == green_version:
                continue  # this value of green's was compared already
            in_force = [v for v in history if v.holds_at(green_version, self.blue_through)]
            if not in_force:
                continue  # blue cannot vouch for the key's value there (yet, or any more)
            self.compared_versions[slot] = green_version
            self._count(sink, key, in_force[-1].value, green_value)

    def keys_to_look_up(self, sink: str, limit: int) -> list[str]:
        """The next `limit` keys of `sink` blue has values of, round-robin across calls: a
        look-up per batch covers every key of a large state in turn."""
        names = [key for (name, key) in self.blue_values if name == sink]
        if len(names) <= limit:
            return names
        start = self.look_up_from % len(names)
        self.look_up_from = start + limit
        return (names[start:] + names[:start])[:limit]

    def note_appended(self, sink: str, key: str, fields: dict, by_blue: bool) -> None:
        """A record appended once per key, computed by blue or written by green: compared as
        soon as the other side's is there."""
        slot = (sink, key)
        mine, theirs = (
            (self.blue_appended, self.green_appended)
            if by_blue
            else (self.green_appended, self.blue_appended)
        )
        if slot in theirs:
            other = theirs.pop(slot)
            blue, green = (fields, other) if by_blue else (other, fields)
            self._count(sink, key, _text(blue), _text(green))
        elif len(mine) < PENDING_MAX:
            mine[slot] = fields

    def _count(self, sink: str, key: str, blue: str, green: str) -> None:
        self.compared += 1
        if blue != green:
            self.differing += 1
            if len(self.examples) < EXAMPLES:
                self.examples.append(f"{sink} {key!r}: old {blue}, new {green}")

    def report(self) -> dict:
        """What blue's heartbeat carries (`result_check`)."""
        return {
            "comparable": self.comparable,
            "compared": self.compared,
            "differing": self.differing,
            "examples": list(self.examples),
        }


def _text(fields: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(fields.items()))
