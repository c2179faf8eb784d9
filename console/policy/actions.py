"""Actions the policy proposes. The policy never performs them: the controller does, and the
console shows them with their reasons."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class AddStandby:
    """Start a hot standby of `operator` on `node`."""

    operator: str
    node: str
    reason: str

    def to_dict(self) -> dict:
        """JSON-serialisable form with an "action" tag."""
        return {"action": "add_standby", **asdict(self)}


@dataclass(frozen=True)
class DropStandby:
    """Stop the standby of `operator` that runs on `node`."""

    operator: str
    node: str
    reason: str

    def to_dict(self) -> dict:
        """JSON-serialisable form with an "action" tag."""
        return {"action": "drop_standby", **asdict(self)}


@dataclass(frozen=True)
class MoveStandby:
    """Replace the standby of `operator` on `from_node` with one on `to_node`."""

    operator: str
    from_node: str
    to_node: str
    reason: str

    def to_dict(self) -> dict:
        """JSON-serialisable form with an "action" tag."""
        return {"action": "move_standby", **asdict(self)}


@dataclass(frozen=True)
class SetCheckpointInterval:
    """Use a checkpoint interval of `seconds` for the (passive) `operator`."""

    operator: str
    seconds: float
    reason: str

    def to_dict(self) -> dict:
        """JSON-serialisable form with an "action" tag."""
        return {"action": "set_checkpoint_interval", **asdict(self)}


Action = AddStandby | DropStandby | MoveStandby | SetCheckpointInterval


def apply_standby_actions(standbys: Mapping[str, str], actions: Iterable[Action]) -> dict[str, str]:
    """The operator -> standby node map after `actions` (interval actions are ignored).

    Raises ValueError when an action does not match the map (dropping or moving a standby that is
    not where the action says), so a stale action list cannot be applied by mistake.
    """
    result = dict(standbys)
    for action in actions:
        if isinstance(action, AddStandby):
            if action.operator in result:
                raise ValueError(
                    f"{action.operator} already has a standby on {result[action.operator]}"
                )
            result[action.operator] = action.node
        elif isinstance(action, DropStandby):
            if result.get(action.operator) != action.node:
                raise ValueError(f"{action.operator} has no standby on {action.node}")
            del result[action.operator]
        elif isinstance(action, MoveStandby):
            if result.get(action.operator) != action.from_node:
                raise ValueError(f"{action.operator} has no standby on {action.from_node}")
            result[action.operator] = action.to_node
    return result
