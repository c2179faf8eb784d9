"""Role-based API permissions: read for viewers, actions for operators, policy for admins."""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from console.roles import ADMIN, OPERATOR, VIEWER, has_role


class RolePermission(BasePermission):
    """Reads need the viewer role; writes need the view's `write_role` (operator by default)."""

    message = "your role does not allow this"

    def has_permission(self, request, view):
        if request.method in SAFE_METHODS:
            return has_role(request.user, VIEWER)
        return has_role(request.user, getattr(view, "write_role", OPERATOR))


class AdminWrites(RolePermission):
    """Same as RolePermission with admin as the write role (for the policy)."""

    def has_permission(self, request, view):
        if request.method in SAFE_METHODS:
            return has_role(request.user, VIEWER)
        return has_role(request.user, ADMIN)


class AdminOnly(RolePermission):
    """Reads and writes need the admin role (the audit log: not job data, so no team scoping)."""

    def has_permission(self, request, view):
        return has_role(request.user, ADMIN)
