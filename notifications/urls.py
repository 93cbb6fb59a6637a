"""Routes of the notifications pages and their API, ``/api/v1/subscriptions/`` (one include in
portal.urls)."""

from django.urls import include, path

from notifications import views

urlpatterns = [
    path("api/v1/", include("notifications.api")),  # subscriptions/
    path("account/notifications/", views.subscriptions_page, name="notifications"),
    path(
        "account/notifications/<int:subscription_id>/",
        views.subscription_detail,
        name="notification-detail",
    ),
    path(
        "account/notifications/<int:subscription_id>/test/",
        views.subscription_test,
        name="notification-test",
    ),
    path(
        "account/notifications/<int:subscription_id>/delete/",
        views.subscription_delete,
        name="notification-delete",
    ),
]
