"""URL map: console pages, the admin, the REST API with its OpenAPI schema and docs, /healthz."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from console import views
from console.oidc import views as oidc_views

handler400 = "console.views.bad_request"
handler403 = "console.views.permission_denied"
handler404 = "console.views.api_not_found"
handler500 = "console.views.server_error"

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("accounts/login/", oidc_views.SsoLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Single sign-on (docs/ACCESS.md); 404 while OIDC_ISSUER is unset.
    path("accounts/oidc/login/", oidc_views.oidc_login, name="oidc-login"),
    path("accounts/oidc/callback/", oidc_views.oidc_callback, name="oidc-callback"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up code as a script file, not inline: the CSP
    # allows scripts from this site only.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include("console.api.urls")),
    path("console/audit/", views.audit_log_page, name="audit-log"),
    path("console/", include("console.dash.urls")),
    path("django_plotly_dash/", include("django_plotly_dash.urls")),
]
