"""Settings split as in cookiecutter-django: base, local (default), production, test.

Environment modules copy base's settings with `inherit()` rather than a wildcard import, so every
name a module uses is visible in it.
"""

from types import ModuleType


def inherit(namespace: dict, base: ModuleType) -> None:
    """Copy every UPPER_CASE setting of `base` into `namespace` (a settings module's globals())."""
    namespace.update({name: value for name, value in vars(base).items() if name.isupper()})
