"""Admin for webhooks (architecture.md §9): endpoints are edited here; deliveries and their attempts
are records, read-only, with a Resend action behind the ``webhooks.resend_webhookdelivery``
permission (audited)."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from agentops.exceptions import AgentopsError
from agentops.urlsafety import resolved_ahead, url_for_log
from agentops.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from agentops.webhooks.services import webhook_delivery_resend
from agentops.webhooks.signing import SECRET_PREFIX
from interfaces.admin.base import ReadOnlyAdmin

RESEND_PERMISSION = "webhooks.resend_webhookdelivery"
ENDPOINT_CHANGE_PERMISSION = "webhooks.change_webhookendpoint"
URL_HIDDEN = (
    "user:password, query and fragment hidden: shown to users who may change webhook endpoints"
)


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ("url", "kinds_text", "enabled", "disabled_at", "disabled_reason", "created_at")
    list_filter = ("enabled",)
    search_fields = ("url", "description")
    fields = (
        "url",
        "description",
        "kinds",
        "enabled",
        "secret",
        "disabled_at",
        "disabled_reason",
        "created_at",
    )
    readonly_fields = ("disabled_at", "disabled_reason", "created_at")
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    @admin.display(description="kinds")
    def kinds_text(self, obj: WebhookEndpoint) -> str:
        return ", ".join(obj.kinds) or "every kind"

    # The secret signs what receivers trust, and the URL may carry a token (user:password@ or
    # its query): a user who may only view endpoints sees the secret masked and the URL as
    # url_for_log gives it, in the list, on the page and through search. The add page shows the
    # generated secret to whoever adds the endpoint.
    MASKED: ClassVar[dict[str, str]] = {"secret": "secret_masked", "url": "url_redacted"}

    def get_fields(self, request: HttpRequest, obj: WebhookEndpoint | None = None) -> list[Any]:
        fields = list(super().get_fields(request, obj))
        if not self._shows_secrets(request, obj):
            fields = [self._masked(name) for name in fields]
        return fields

    def get_readonly_fields(
        self, request: HttpRequest, obj: WebhookEndpoint | None = None
    ) -> list[str]:
        readonly = list(super().get_readonly_fields(request, obj))
        return readonly if self._shows_secrets(request, obj) else [*readonly, *self.MASKED.values()]

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        columns = list(super().get_list_display(request))
        return (
            columns
            if self.has_change_permission(request)
            else [self._masked(name) for name in columns]
        )

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        # A search on the URL would tell a viewer whether its hidden part contains what they
        # typed, which spells a token out a guess at a time.
        fields = list(super().get_search_fields(request))
        return fields if self.has_change_permission(request) else [f for f in fields if f != "url"]

    def _masked(self, name: Any) -> Any:
        return self.MASKED.get(name, name) if isinstance(name, str) else name

    def _shows_secrets(self, request: HttpRequest, obj: WebhookEndpoint | None) -> bool:
        return obj is None or self.has_change_permission(request, obj)

    @admin.display(description="secret")
    def secret_masked(self, obj: WebhookEndpoint) -> str:
        return f"{SECRET_PREFIX}… (hidden: shown to users who may change webhook endpoints)"

    @admin.display(description="URL")
    def url_redacted(self, obj: WebhookEndpoint) -> str:
        shown = url_for_log(obj.url)
        return f"{shown} ({URL_HIDDEN})" if _has_hidden_parts(obj.url) else shown

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # Django runs a POST's form validation inside the transaction it opens for the save
        # (ModelAdmin.changeform_view), and the URL's validator resolves the host: look the host
        # up here, before that transaction, so no transaction waits on DNS (STYLE 6).
        if request.method != "POST" or settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE:
            return super().changeform_view(request, object_id, form_url, extra_context)
        with resolved_ahead(_as_the_form_reads_it(request.POST.get("url", ""))):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: ModelForm, change: bool
    ) -> None:
        if obj.enabled and obj.disabled_at is not None:  # an operator turned it back on
            obj.disabled_at, obj.disabled_reason = None, ""
        elif not obj.enabled and obj.disabled_at is None:
            obj.disabled_at, obj.disabled_reason = (
                timezone.now(),
                f"disabled by admin:{request.user.get_username()}",
            )
        super().save_model(request, obj, form, change)


def _has_hidden_parts(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return True
    return "@" in parts.netloc or bool(parts.query or parts.fragment)


def _as_the_form_reads_it(raw: str) -> str:
    """The URL the endpoint form will check (a missing scheme means https), or ``raw`` if the
    form will refuse it anyway."""
    try:
        return str(forms.URLField(assume_scheme="https", required=False).clean(raw))
    except ValidationError:
        return raw


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = (
        "number",
        "started_at",
        "ended_at",
        "outcome",
        "status_code",
        "duration_ms",
        "error",
        "response_excerpt",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Attempts are part of the delivery's record: whoever may see the delivery sees them.
        return request.user.has_perm("webhooks.view_webhookdelivery")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "webhook_id",
        "endpoint",
        "alert",
        "status",
        "attempts",
        "next_attempt_at",
        "short_error",
        "created_at",
    )
    list_filter = ("status", "endpoint")
    search_fields = ("webhook_id", "endpoint__url")
    list_select_related = ("endpoint", "alert")
    inlines = [WebhookAttemptInline]
    actions = ["resend"]

    @admin.display(description="last error")
    def short_error(self, obj: WebhookDelivery) -> str:
        return obj.last_error[:160]

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        # As on the endpoint list: searching the URL would spell out its hidden part to a user
        # who may not see it.
        fields = list(super().get_search_fields(request))
        return (
            fields
            if request.user.has_perm(ENDPOINT_CHANGE_PERMISSION)
            else [f for f in fields if f != "endpoint__url"]
        )

    def has_resend_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(RESEND_PERMISSION)

    @admin.action(
        description="Resend the selected deliveries (same webhook-id)", permissions=["resend"]
    )
    def resend(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        resent = 0
        for delivery_id in queryset.values_list("id", flat=True):
            try:
                webhook_delivery_resend(
                    delivery_id=delivery_id,
                    actor=f"admin:{request.user.get_username()}",
                    now=timezone.now(),
                )
                resent += 1
            except AgentopsError as exc:
                self.message_user(request, exc.message, level="warning")
        self.message_user(request, f"Resent {resent} delivery(ies).")
