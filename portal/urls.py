"""Top-level routes: pages, the REST API, its schema and docs, the Django admin."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from portal import (
    cluster_views,
    environment_views,
    lab_origin,
    lab_proxy,
    live_views,
    usage_views,
    whatif_views,
)
from portal import views as portal_views
from portal.metrics import metrics_view

urlpatterns = [
    path("", portal_views.dashboard, name="dashboard"),
    path("login/", portal_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("oidc/", include("tenancy.oidc_views")),  # single sign-on; 404s while it is off
    path("account/token/", portal_views.api_token, name="api-token"),
    path(
        "account/token/<int:token_id>/revoke/",
        portal_views.revoke_api_token,
        name="api-token-revoke",
    ),
    path("live/tenants/<int:tenant_id>/jobs.json", live_views.tenant_jobs, name="live-tenant"),
    path("live/jobs/<int:job_id>.json", live_views.job, name="live-job"),
    path("live/cluster.json", cluster_views.cluster_json, name="live-cluster"),
    path("cluster/", cluster_views.cluster, name="cluster"),
    path("cluster/topology/", cluster_views.topology, name="topology"),
    path("cluster/topology/export.json", cluster_views.topology_export, name="topology-export"),
    path(
        "cluster/topology/gpus/<int:index>/clear-suspect/",
        cluster_views.gpu_clear_suspect,
        name="gpu-clear-suspect",
    ),
    path(
        "cluster/topology/servers/<str:node>/<str:action>/",
        cluster_views.server_action,
        name="server-action",
    ),
    path("cluster/environments/", environment_views.environments, name="environments"),
    path("cluster/shells/", include("portal.shell_urls")),  # the admins' open shells
    path(
        "cluster/environments/<str:node>/<str:key>/evict/",
        environment_views.evict_environment,
        name="environment-evict",
    ),
    path("tenants/", include("portal.tenant_urls")),  # members; the admins' tenant pages
    path("audit/", include("portal.audit_views")),  # the audit log and its CSV export
    path("usage/", usage_views.tenant_usage, name="usage"),
    path("usage/all/", usage_views.cluster_usage, name="usage-all"),
    path("whatif/", whatif_views.whatif, name="whatif"),
    path("whatif/<str:run_id>/", whatif_views.whatif_run, name="whatif-run"),
    path("whatif/<str:run_id>.json", whatif_views.whatif_run_json, name="whatif-run-json"),
    path("", include("notifications.urls")),  # /account/notifications/, /api/v1/subscriptions/
    path("", include("bundles.urls")),  # the Code page and /api/v1/code/
    path("", include("tenancy.urls")),  # /api/v1/: me, tenants' members, tokens, audit
    path("", include("inventory.urls")),  # /api/v1/gpus/
    path("", include("shells.urls")),  # /api/v1/shells/
    path("", include("jobs.urls")),  # job pages; /api/v1/ jobs, stats, usage, tenants
    path("api/v1/", include("portal.api.urls")),  # the API's root page
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file: no inline script (CSP).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    path("metrics", metrics_view, name="metrics"),
    # A session's JupyterLab, relayed by its node's agent (portal.lab_proxy).
    re_path(r"^sessions/(?P<job_id>[0-9]{1,18})/lab/", lab_proxy.lab, name="session-lab"),
    # Its "Open JupyterLab" link: to the lab's own host with a one-use ticket (lab_origin).
    path("sessions/<int:job_id>/lab-open/", lab_origin.lab_open, name="session-lab-open"),
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico on pages without base.html's icon (admin, Swagger UI).
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.svg"), permanent=True)),
]

# The portal's own pages (JSON for JSON callers): portal.error_views.
handler400 = "portal.error_views.bad_request"
handler403 = "portal.error_views.permission_denied"
handler404 = "portal.error_views.page_not_found"
handler500 = "portal.error_views.server_error"
