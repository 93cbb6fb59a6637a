"""``/api/v1/subscriptions/``: your notification subscriptions, their test button and delivery log.

Included by ``portal/api/urls.py``. Another user's subscription is a 404.
"""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.serializers import BaseSerializer

from notifications.models import Delivery, DeliveryAttempt, Subscription
from notifications.serializers import (
    DeliverySerializer,
    SubscriptionCreateSerializer,
    SubscriptionDetailSerializer,
    SubscriptionSerializer,
)
from notifications.services import (
    NotificationError,
    TooManyTests,
    check_subscription,
    do_create_subscription,
    do_delete_subscription,
    do_send_test_event,
)


def _as_api_error(exc: NotificationError) -> ValidationError:
    return ValidationError({exc.field: [exc.message]})


class SubscriptionViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Subscription],
):
    """Webhook and email subscriptions to your jobs' events (or a tenant's)."""

    serializer_class = SubscriptionSerializer

    def get_queryset(self) -> QuerySet[Subscription]:
        return Subscription.objects.restrict(self.request.user).select_related("tenant")

    def get_serializer_class(self) -> type[BaseSerializer[Subscription]]:
        return SubscriptionDetailSerializer if self.action == "retrieve" else SubscriptionSerializer

    @extend_schema(
        request=SubscriptionCreateSerializer, responses={201: SubscriptionDetailSerializer}
    )
    def create(self, request: Request) -> Response:
        """Subscribe; a webhook's answer carries its signing ``secret`` (also on retrieve)."""
        fields = SubscriptionCreateSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        data = fields.validated_data
        try:
            spec = check_subscription(
                owner=request.user,  # type: ignore[arg-type]
                tenant_slug=data.get("tenant") or None,
                events=data["events"],
                channel=data["channel"],
                url=data.get("url", ""),
                email=data.get("email", ""),
                queued_minutes=data.get("queued_minutes"),
            )
            subscription = do_create_subscription(
                owner=request.user,  # type: ignore[arg-type]
                spec=spec,
                now=timezone.now(),
            )
        except NotificationError as exc:
            raise _as_api_error(exc) from exc
        return Response(
            SubscriptionDetailSerializer(subscription).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        """Delete the subscription and its delivery log."""
        do_delete_subscription(subscription=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={202: DeliverySerializer, 429: None})
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str | None = None) -> Response:
        """Send a test event (type ``job.test``) to this subscription; see its deliveries.

        Limited per user (``NOTIFICATION_TESTS_PER_WINDOW``): beyond, a 429 with Retry-After.
        """
        try:
            delivery = do_send_test_event(subscription=self.get_object(), now=timezone.now())
        except TooManyTests as exc:
            return Response(
                {"detail": exc.message},
                status=status.HTTP_429_TOO_MANY_REQUESTS,
                headers={"Retry-After": str(exc.retry_after_s)},
            )
        return Response(DeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: DeliverySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        """The subscription's deliveries, newest first, each with its attempts."""
        subscription = self.get_object()
        deliveries = Delivery.objects.filter(subscription=subscription).prefetch_related(
            Prefetch("attempt_log", queryset=DeliveryAttempt.objects.order_by("at", "id"))
        )
        paginator = self.paginator
        page = None if paginator is None else paginator.paginate_queryset(deliveries, request, self)
        if paginator is None or page is None:
            return Response(DeliverySerializer(deliveries, many=True).data)
        return paginator.get_paginated_response(DeliverySerializer(page, many=True).data)


router = SimpleRouter()
router.register("subscriptions", SubscriptionViewSet, basename="subscription")

urlpatterns = router.urls
