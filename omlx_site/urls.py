from django.contrib import admin
from django.urls import include, path

from pool.api.django_handlers import bad_request, not_found, server_error

urlpatterns = [
    path("", include("pool.api.urls")),
    path("", include("dashboard.urls")),
    path("admin/", admin.site.urls),
]

handler400 = bad_request
handler404 = not_found
handler500 = server_error
