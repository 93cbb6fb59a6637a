"""The account's notifications pages: list, create, delete, test, and each delivery log."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from notifications.forms import SubscriptionForm
from notifications.models import Delivery, DeliveryAttempt, Subscription
from notifications.services import (
    NotificationError,
    TooManyTests,
    check_subscription,
    do_create_subscription,
    do_delete_subscription,
    do_send_test_event,
)
from tenancy.models import Tenant

LOG_ROWS = 100


@login_required
def subscriptions_page(request: HttpRequest) -> HttpResponse:
    """List the user's subscriptions; a valid POST creates one and shows its page."""
    tenants = list(Tenant.objects.restrict(request.user).order_by("slug"))
    form = SubscriptionForm(request.POST or None, tenants=tenants)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            spec = check_subscription(
                owner=request.user,  # type: ignore[arg-type]
                tenant_slug=data["tenant"] or None,
                events=list(data["events"]),
                channel=data["channel"],
                url=data["url"],
                email=data["email"],
                queued_minutes=data["queued_minutes"],
            )
            subscription = do_create_subscription(
                owner=request.user,  # type: ignore[arg-type]
                spec=spec,
                now=timezone.now(),
            )
        except NotificationError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, "Subscribed.")
            return redirect("notification-detail", subscription_id=subscription.pk)
    subscriptions = Subscription.objects.restrict(request.user).select_related("tenant")
    return render(
        request,
        "notifications/list.html",
        {"form": form, "subscriptions": subscriptions},
        status=400 if form.errors else 200,
    )


@login_required
def subscription_detail(request: HttpRequest, subscription_id: int) -> HttpResponse:
    """One subscription: its secret (webhooks), the test button and the delivery log."""
    subscription = get_object_or_404(
        Subscription.objects.restrict(request.user).select_related("tenant"), pk=subscription_id
    )
    deliveries = Delivery.objects.filter(subscription=subscription).prefetch_related(
        Prefetch("attempt_log", queryset=DeliveryAttempt.objects.order_by("at", "id"))
    )[:LOG_ROWS]
    return render(
        request,
        "notifications/detail.html",
        {"subscription": subscription, "deliveries": deliveries},
    )


@login_required
@require_POST
def subscription_test(request: HttpRequest, subscription_id: int) -> HttpResponse:
    """Queue a test event for one subscription and come back to its log."""
    subscription = get_object_or_404(
        Subscription.objects.restrict(request.user), pk=subscription_id
    )
    try:
        delivery = do_send_test_event(subscription=subscription, now=timezone.now())
    except TooManyTests as exc:
        messages.error(request, exc.message)
        response = subscription_detail(request, subscription_id=subscription.pk)
        response.status_code = 429
        response["Retry-After"] = str(exc.retry_after_s)
        return response
    messages.success(request, f"Test event {delivery.event_id} queued.")
    return redirect("notification-detail", subscription_id=subscription.pk)


@login_required
@require_POST
def subscription_delete(request: HttpRequest, subscription_id: int) -> HttpResponse:
    """Delete one of the user's subscriptions (another user's is a 404)."""
    subscription = get_object_or_404(
        Subscription.objects.restrict(request.user), pk=subscription_id
    )
    do_delete_subscription(subscription=subscription)
    messages.success(request, "Subscription deleted.")
    return redirect("notifications")
