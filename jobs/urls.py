"""Routes of the jobs app: the submit, job, array, sweep and session pages and ``/api/v1/`` for jobs, their
statistics and usage, tenants and the nodes' environments (one include in portal.urls)."""

from django.urls import include, path

from jobs import session_views, sweep_views, views

urlpatterns = [
    path("jobs/new/", views.submit_job, name="job-new"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.cancel_job, name="job-cancel"),
    path("arrays/<int:array_id>/", views.array_detail, name="array-page"),
    path("arrays/<int:array_id>/cancel/", views.cancel_array, name="array-page-cancel"),
    path("arrays/<int:array_id>/retry/", views.retry_array, name="array-page-retry"),
    path("sweeps/", sweep_views.sweep_list, name="sweeps-page"),
    path("sweeps/<int:sweep_id>/", sweep_views.sweep_detail, name="sweep-page"),
    path("sweeps/<int:sweep_id>/cancel/", sweep_views.cancel_sweep, name="sweep-page-cancel"),
    path("sessions/", session_views.session_list, name="sessions-page"),
    path("sessions/<int:job_id>/", session_views.session_detail, name="session-page"),
    path("sessions/<int:job_id>/stop/", session_views.stop_session_page, name="session-page-stop"),
    path("api/v1/", include("jobs.api.urls")),
]
