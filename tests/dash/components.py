"""Reading Dash component trees in tests."""

from __future__ import annotations


def text_of(component) -> str:
    """All text inside a Dash component tree (or list of them), joined by spaces."""
    if component is None:
        return ""
    if isinstance(component, str | int | float):
        return str(component)
    if isinstance(component, list | tuple):
        return " ".join(text_of(c) for c in component)
    return text_of(getattr(component, "children", None))


def ids_in(component) -> set[str]:
    """Every string id inside a Dash component tree."""
    found: set[str] = set()
    if isinstance(component, list | tuple):
        for child in component:
            found |= ids_in(child)
        return found
    if component is None or isinstance(component, str | int | float):
        return found
    component_id = getattr(component, "id", None)
    if isinstance(component_id, str):
        found.add(component_id)
    return found | ids_in(getattr(component, "children", None))
