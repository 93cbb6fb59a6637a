"""The sweeps REST API (``/api/v1/sweeps/``): thin, like the arrays' — parse, authorize, call
``jobs.sweeps``, serialize.  A sweep of another tenant is a 404, as a missing one."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.api.serializers import JobCancelSerializer, JobCreateSerializer
from jobs.api.views import object_body, submission
from jobs.models import Sweep
from jobs.sweeps import best_of, check_sweep_spec, do_cancel_sweep, do_submit_sweep, trial_rows
from portalctl.sweep_fields import SWEEP_FIELDS
from tenancy.models import Tenant
from tenancy.services import resolve_tenant_for_write

SPACE_HELP = (
    'Hyperparameters by name: {"lr": {"type": "loguniform", "low": 1e-4, "high": 0.1}, '
    '"layers": {"type": "grid", "values": [2, 4]}}; types grid (enumerated), choice, uniform, '
    "loguniform, int. Each trial's job gets HP_<NAME> and SWEEP_PARAMS in its environment."
)


class SweepCreateSerializer(JobCreateSerializer):
    """What a client sends to start a sweep: the trials' job (a program) plus the search
    (documents the schema; the rules live in ``jobs.sweeps`` and ``scheduler.asha``)."""

    search_space = serializers.DictField(child=serializers.JSONField(), help_text=SPACE_HELP)
    metric = serializers.CharField(help_text="The metric the program logs (ctx.log_metrics).")
    mode = serializers.ChoiceField(choices=["min", "max"], required=False, default="min")
    strategy = serializers.ChoiceField(
        choices=["grid", "random", "asha"], required=False, default="asha"
    )
    eta = serializers.IntegerField(
        min_value=2, required=False, help_text="ASHA's reduction factor (default 3)."
    )
    min_steps = serializers.IntegerField(
        min_value=1, required=False, help_text="The first rung's step budget (ASHA)."
    )
    max_steps = serializers.IntegerField(min_value=1, help_text="The top rung's step budget.")
    max_trials = serializers.IntegerField(
        min_value=1, required=False, help_text="Trials in all (a grid: its size by default)."
    )
    max_gpu_hours = serializers.FloatField(required=False, allow_null=True)
    max_running = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    seed = serializers.IntegerField(min_value=0, required=False)


class TrialSerializer(serializers.Serializer[Any]):
    """One trial: its point, how far it got, its results by rung and its current job."""

    index = serializers.IntegerField()
    params = serializers.DictField(child=serializers.JSONField())
    rung = serializers.IntegerField()
    status = serializers.CharField()
    reason = serializers.CharField()
    results = serializers.DictField(child=serializers.FloatField())
    metric = serializers.FloatField(allow_null=True)
    job = serializers.IntegerField(allow_null=True)
    job_state = serializers.CharField()
    gpus = serializers.IntegerField()
    sched_weight = serializers.FloatField()


class BestTrialSerializer(serializers.Serializer[Any]):
    """The best trial so far, with its newest checkpoint (``{"id", "step", "kind"}``)."""

    index = serializers.IntegerField()
    params = serializers.DictField(child=serializers.JSONField())
    metric = serializers.FloatField(allow_null=True)
    job = serializers.IntegerField(allow_null=True)
    checkpoint = serializers.DictField(allow_null=True)


class SweepSerializer(serializers.ModelSerializer[Sweep]):
    """A sweep as the API returns it."""

    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )

    class Meta:
        model = Sweep
        fields = [
            "id",
            "tenant",
            "name",
            *SWEEP_FIELDS,
            "state",
            "reason",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields


class SweepDetailSerializer(SweepSerializer):
    """One sweep with its trials and its best trial."""

    trials = serializers.SerializerMethodField()
    best = serializers.SerializerMethodField()

    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "trials", "best"]
        read_only_fields = fields

    @extend_schema_field(TrialSerializer(many=True))
    def get_trials(self, sweep: Sweep) -> list[dict[str, Any]]:
        """Every trial, by index."""
        return trial_rows(sweep)

    @extend_schema_field(BestTrialSerializer(allow_null=True))
    def get_best(self, sweep: Sweep) -> dict[str, Any] | None:
        """The best result at the highest rung reached (None: no result yet)."""
        return best_of(sweep)


def _detail(sweep: Sweep) -> dict[str, Any]:
    return dict(SweepDetailSerializer(sweep).data)


class SweepViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Sweep],
):
    """Start, list and inspect hyperparameter sweeps of your tenants; cancel them."""

    serializer_class = SweepSerializer

    def get_queryset(self) -> QuerySet[Sweep]:
        return Sweep.objects.restrict(self.request.user).select_related("tenant")

    @extend_schema(responses=SweepDetailSerializer)
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """One sweep: its trials (rung, status, metric, job) and the best one."""
        return Response(_detail(self.get_object()))

    @extend_schema(request=SweepCreateSerializer, responses={201: SweepDetailSerializer})
    def create(self, request: Request) -> Response:
        """Start a sweep: trials of one program, each a job with its hyperparameters in its
        environment, promoted and stopped by the strategy (grid, random or ASHA)."""
        slug, body = submission(request, SweepCreateSerializer)
        tenant = resolve_tenant_for_write(request.user, slug)
        spec = check_sweep_spec(tenant=tenant, data=body)
        sweep = do_submit_sweep(user=request.user, tenant=tenant, spec=spec)
        return Response(_detail(sweep), status=status.HTTP_201_CREATED)

    @extend_schema(request=JobCancelSerializer, responses=SweepDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel the sweep: every running trial's job is cancelled, every live trial stopped."""
        sweep = self.get_object()
        fields = JobCancelSerializer(data=object_body(request, {"reason"}))
        fields.is_valid(raise_exception=True)
        reason = fields.validated_data.get("reason") or ""
        sweep = do_cancel_sweep(user=request.user, sweep_id=sweep.pk, reason=reason)
        return Response(_detail(sweep))
