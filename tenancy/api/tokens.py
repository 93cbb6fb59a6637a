"""``/api/v1/tokens/``: the caller's own API tokens — list, create (secret shown once), revoke."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from tenancy.models import ApiToken, TokenScope
from tenancy.token_services import TokenLifetimeError, do_create_token, do_revoke_token
from tenancy.tokens import MAX_NAME_LENGTH


class ApiTokenSerializer(serializers.ModelSerializer[ApiToken]):
    """A token as its owner sees it in a list: never its secret."""

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "scope",
            "prefix",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        ]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer[Any]):
    """What a new token is: its name, scope and lifetime (default ``API_TOKEN_DAYS``).

    The lifetime is at most the site's ``API_TOKEN_MAX_DAYS``, or the shortest
    ``max_token_days`` of the caller's tenants: past it, a 400 on ``expires_in_days``
    that names the maximum.
    """

    name = serializers.CharField(max_length=MAX_NAME_LENGTH)
    scope = serializers.ChoiceField(choices=TokenScope.choices, default=TokenScope.WRITE)
    expires_in_days = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="Days until it expires (default API_TOKEN_DAYS); at most API_TOKEN_MAX_DAYS "
        "or the shortest maximum of your tenants.",
    )


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    """A token just made, with its secret: the only answer that ever carries it."""

    token = serializers.SerializerMethodField(help_text="The secret; it is not shown again.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields

    def get_token(self, token: ApiToken) -> str:
        """The secret, which the view passes in the context (it is stored nowhere)."""
        return str(self.context["secret"])


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[ApiToken],
):
    """Your API tokens; another user's are not found (404)."""

    serializer_class = ApiTokenSerializer
    pagination_class = None

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.restrict(self.request.user)

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenCreatedSerializer})
    def create(self, request: Request) -> Response:
        """Make a token; the answer's ``token`` is its secret, shown this once."""
        fields = ApiTokenCreateSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        try:
            issued = do_create_token(user=request.user, **fields.validated_data)
        except TokenLifetimeError as refused:
            raise ValidationError({refused.field: [str(refused)]}) from None
        created = ApiTokenCreatedSerializer(issued.token, context={"secret": issued.secret})
        return Response(created.data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        """Revoke a token: it stops working at once and stays listed as revoked."""
        token = self.get_object()
        do_revoke_token(user=request.user, token_id=token.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)
