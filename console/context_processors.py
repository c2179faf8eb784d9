"""Template context shared by every page."""

from console.roles import ADMIN, OPERATOR, has_role, role_of


def role(request):
    """Expose the user's role and what it allows, so templates show only permitted controls."""
    user = getattr(request, "user", None)
    return {
        "user_role": role_of(user),
        "can_operate": has_role(user, OPERATOR),
        "can_administer": has_role(user, ADMIN),
    }
