"""The admins' page of open shells, ``/cluster/shells/`` (one include in portal.urls)."""

from django.urls import path

from portal import shell_views

urlpatterns = [
    path("", shell_views.open_shells_page, name="cluster-shells"),
    path("open.json", shell_views.open_shells_json, name="cluster-shells-json"),
    path("<str:shell_id>/close/", shell_views.close_shell, name="cluster-shell-close"),
]
