"""API routes under /api/."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from console.api import alerting, views
from console.auth_throttle import obtain_auth_token

router = DefaultRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("topologies", views.TopologyViewSet, basename="topology")
router.register(r"jobs/(?P<job_pk>\d+)/faults", views.JobFaultViewSet, basename="job-fault")
router.register(r"jobs/(?P<job_pk>\d+)/upgrades", views.JobUpgradeViewSet, basename="job-upgrade")
router.register(
    r"jobs/(?P<job_pk>\d+)/recoveries", views.JobRecoveryViewSet, basename="job-recovery"
)
router.register("recoveries", views.RecoveryViewSet, basename="recovery")
router.register("alert-routes", alerting.AlertRouteViewSet, basename="alert-route")
router.register("alert-deliveries", alerting.AlertDeliveryViewSet, basename="alert-delivery")
router.register("alerts", alerting.AlertViewSet, basename="alert")

urlpatterns = [
    path("auth/token/", obtain_auth_token, name="api-token"),
    path("fleet/", views.FleetView.as_view(), name="fleet"),
    path("audit/", views.AuditView.as_view(), name="audit"),
    path("policy/", views.PolicyView.as_view(), name="policy"),
    path("policy/history/", views.PolicyHistoryView.as_view(), name="policy-history"),
    path("policy/revert/<int:version>/", views.PolicyRevertView.as_view(), name="policy-revert"),
    path("", include(router.urls)),
]
