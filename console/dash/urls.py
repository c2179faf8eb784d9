"""Console page routes under /console/."""

from django.urls import path

from console.dash import views

app_name = "console"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("jobs/<int:job_id>/", views.job, name="job"),
    path("placement/", views.placement, name="placement"),
    path("recoveries/", views.recoveries, name="recoveries"),
    path("resources/", views.resources, name="resources"),
    path("alerts/", views.alerting, name="alerts"),
]
