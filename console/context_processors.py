"""Template context shared by every page."""

from console.models import Policy
from console.roles import ADMIN, OPERATOR, has_role, role_of


def role(request):
    """Expose the user's role and what it allows, so templates show only permitted controls."""
    user = getattr(request, "user", None)
    return {
        "user_role": role_of(user),
        "can_operate": has_role(user, OPERATOR),
        "can_administer": has_role(user, ADMIN),
    }


def policy_version(request):
    """`policy_version`: the number of the policy version in force, for the top bar.

    Read-only (no default version is written from a page view); None before the first version
    exists, which the controller creates on its first cycle.
    """
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"policy_version": None}
    latest = Policy.objects.order_by("-version").values_list("version", flat=True).first()
    return {"policy_version": latest}
