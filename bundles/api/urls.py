"""Routes of the code API, mounted under ``/api/v1/``."""

from rest_framework.routers import SimpleRouter

from bundles.api.views import CodeBundleViewSet

router = SimpleRouter()
router.register("code", CodeBundleViewSet, basename="code")

urlpatterns = router.urls
