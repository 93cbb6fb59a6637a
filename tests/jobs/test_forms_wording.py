"""The submit form words its errors with the labels users see (issue 19, item 7)."""

from __future__ import annotations

from typing import Any

import pytest

from inventory.services import do_load_topology
from jobs.forms import JobForm, fabric_words, nearest_placeable, workload_guide
from jobs.models import Job
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db


def form_for(user: Any, **fields: Any) -> JobForm:
    data = {
        "tenant": "acme",
        "name": "train",
        "workload": "mlp-digits",
        "gpus": "2",
        "priority": "50",
        "recovery": "consistent",
        "checkpoint_interval": "50",
    }
    data.update({k: str(v) for k, v in fields.items()})
    return JobForm(data, tenants=Tenant.objects.filter(slug="acme"), user=user)


def small_fabric() -> None:
    """Two leaves of 4 GPUs: 1-4 fit in a leaf, 8 splits 2 x 4, 5-7 cannot be isolated."""
    do_load_topology({"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2})


def test_min_above_max_is_said_with_the_field_labels(alice: Any) -> None:
    form = form_for(alice, gpus=2, min_gpus=4, max_gpus=2)
    assert not form.is_valid()
    assert form.errors["min_gpus"] == ["Min GPUs cannot exceed Max GPUs."]
    assert not Job.objects.exists()


def test_requested_outside_the_range_names_both_bounds(alice: Any) -> None:
    form = form_for(alice, gpus=6, min_gpus=1, max_gpus=4)
    assert not form.is_valid()
    assert "GPUs requested must lie between Min GPUs (1) and Max GPUs (4)." in form.errors["gpus"]


def test_the_limit_stated_is_the_tenants_quota_not_the_apis(alice: Any) -> None:
    over = form_for(alice, gpus=12, min_gpus=12, max_gpus=12)
    assert not over.is_valid()
    assert over.errors["gpus"] == ["GPUs requested cannot exceed 8, the GPU quota of tenant acme."]
    huge = form_for(alice, gpus=5000)
    assert not huge.is_valid()
    assert huge.errors["gpus"] == ["Must be between 1 and 8, the GPU quota of tenant acme."]
    assert "4096" not in str(huge.errors)
    # and the field says so before anyone submits
    assert "At most 8, the GPU quota of tenant acme." in str(form_for(alice)["gpus"].help_text)


def test_a_shape_the_fabric_cannot_isolate_is_explained_with_sizes_that_work(alice: Any) -> None:
    small_fabric()
    assert nearest_placeable(6, most=8) == (4, 8)
    form = form_for(alice, gpus=6, min_gpus=6, max_gpus=6)
    assert not form.is_valid()
    (message,) = form.errors["gpus"]
    assert message == fabric_words(6, 8)
    assert (
        "6 GPUs cannot be given switches of their own on this cluster (2 leaf switches of 4 GPUs)"
        in message
    )
    assert message.endswith("The nearest sizes that can: 4 or 8.")
    assert "m x n" not in message
    assert not Job.objects.exists()


def test_every_error_of_a_field_is_reworded(alice: Any) -> None:
    small_fabric()  # 6 cannot be isolated and exceeds Max GPUs: both said in the form's words
    form = form_for(alice, gpus=2, min_gpus=6, max_gpus=2)
    assert not form.is_valid()
    assert form.errors["min_gpus"] == ["Min GPUs cannot exceed Max GPUs.", fabric_words(6, 8)]


def test_no_larger_size_fits_the_quota(alice: Any) -> None:
    small_fabric()
    assert fabric_words(7, 7).endswith("The nearest sizes that can: 4.")


def test_the_workload_guide_lists_defaults_and_ranges() -> None:
    digits = workload_guide()["mlp-digits"]
    assert digits["default_batch_size"] == 64
    epochs = {a["name"]: a for a in digits["args"]}["epochs"]
    assert (epochs["default"], epochs["minimum"], epochs["maximum"]) == (20, 1, 100_000)
    assert epochs["kind"] == "whole number"


def test_select_options_are_short_and_their_meaning_is_in_the_help(alice: Any) -> None:
    form = form_for(alice)
    for name in ("workload", "recovery", "launcher"):
        labels = [str(label) for _, label in form.fields[name].choices]  # type: ignore[attr-defined]
        assert labels and max(len(label) for label in labels) <= 20, (name, labels)
    assert "restore the latest checkpoint" in str(form.fields["recovery"].help_text)
