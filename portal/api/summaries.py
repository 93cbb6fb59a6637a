"""One-line summaries of the API's operations, as Swagger UI lists them.

drf-spectacular takes each operation's description from its view's docstring,
which a list and its detail view share; the summary is the short, distinct line
a reader scans for.  A postprocessing hook fills it in by operation id; an
operation missing here has none, and a test says which.
"""

from __future__ import annotations

from typing import Any

from portal.api.schema import HTTP_METHODS

SUMMARIES: dict[str, str] = {
    "v1_audit_list": "The audit log: who changed what, filtered (admins, tenant owners)",
    "v1_code_list": "List your tenant's uploaded programs",
    "v1_code_create": "Upload a program (a .tar.gz or .zip)",
    "v1_code_retrieve": "Show one uploaded program and its files",
    "v1_environments_list": "Every node's environment cache, as its agent last reported (admins)",
    "v1_environments_evict_create": "Evict one environment from a node's cache (admins)",
    "v1_environments_evictions_list": "The latest environment evictions and their answers (admins)",
    "v1_gpus_suspect_list": "GPUs in a straggler's cool-down (admins)",
    "v1_gpus_suspect_destroy": "Clear a GPU's suspect mark (admins)",
    "v1_servers_list": "Every server: GPU type, pool, state and why, GPU health (admins)",
    "v1_servers_pending_list": "Servers that reported themselves and wait to be accepted (admins)",
    "v1_servers_accept_create": "Accept a pending server onto a leaf (admins)",
    "v1_arrays_list": "List your tenants' job arrays",
    "v1_arrays_create": "Submit a job array",
    "v1_arrays_retrieve": "Show one job array and its tasks",
    "v1_arrays_cancel_create": "Cancel every task of an array",
    "v1_arrays_retry_create": "Retry an array's failed tasks",
    "v1_sweeps_list": "List your tenants' hyperparameter sweeps",
    "v1_sweeps_create": "Start a hyperparameter sweep",
    "v1_sweeps_retrieve": "Show one sweep, its trials and its best trial",
    "v1_sweeps_cancel_create": "Cancel a sweep and its running trials",
    "v1_jobs_list": "List your tenants' jobs",
    "v1_jobs_create": "Submit a job",
    "v1_jobs_retrieve": "Show one job",
    "v1_jobs_partial_update": "Change a job's priority, elastic range or limits",
    "v1_jobs_artifacts_list": "List a job's checkpoints, files and log",
    "v1_jobs_artifacts_download_retrieve": "Download one stored object of a job",
    "v1_jobs_cancel_create": "Cancel a job",
    "v1_jobs_events_list": "A job's history",
    "v1_jobs_logs_retrieve": "A job's output, as lines or a live stream",
    "v1_jobs_metrics_retrieve": "A job's progress and logged metrics",
    "v1_me_retrieve": "Who you are and your tenants",
    "v1_stats_jct_retrieve": "Job completion time statistics",
    "v1_shells_list": "List the shells opened into your tenants' jobs",
    "v1_shells_retrieve": "Show one shell: who opened it, where, how it ended",
    "v1_shells_close_create": "Close an open shell now (admins)",
    "v1_subscriptions_list": "List your notification subscriptions",
    "v1_subscriptions_create": "Subscribe to job events by webhook or email",
    "v1_subscriptions_retrieve": "Show one of your subscriptions, with its webhook secret",
    "v1_subscriptions_destroy": "Delete a subscription",
    "v1_subscriptions_test_create": "Send a test event to a subscription",
    "v1_subscriptions_deliveries_list": "A subscription's deliveries and their attempts",
    "v1_tenants_list": "List your tenants",
    "v1_tenants_retrieve": "Show one tenant",
    "v1_tenants_create": "Create a tenant (admins)",
    "v1_tenants_partial_update": "Change a tenant's quota, weight or defaults (admins)",
    "v1_tenants_members_list": "List a tenant's members and their roles",
    "v1_tenants_members_create": "Add an existing user to a tenant (owners)",
    "v1_tenants_members_partial_update": "Change a member's role (owners)",
    "v1_tenants_members_destroy": "Remove a member from a tenant (owners)",
    "v1_tokens_list": "List your API tokens",
    "v1_tokens_create": "Create an API token",
    "v1_tokens_retrieve": "Show one of your API tokens",
    "v1_tokens_destroy": "Revoke an API token",
    "v1_usage_retrieve": "GPU-hours held, by day, user, job or tenant",
}


def add_summaries(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """Postprocessing hook: give every operation its summary from :data:`SUMMARIES`."""
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method in HTTP_METHODS and not operation.get("summary"):
                summary = SUMMARIES.get(operation.get("operationId", ""))
                if summary:
                    operation["summary"] = summary
    return result
