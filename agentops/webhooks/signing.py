"""Standard Webhooks signing: secrets are ``whsec_`` + base64 of random bytes; a signature is
``v1,`` + base64(HMAC-SHA256(secret bytes, f"{id}.{timestamp}.{body}"))."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24
MESSAGE_ID_PREFIX = "msg_"


def secret_generate() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def message_id_generate() -> str:
    return MESSAGE_ID_PREFIX + secrets.token_urlsafe(18)


def secret_bytes(secret: str) -> bytes:
    """The key behind a ``whsec_`` secret. Raises ValueError for a secret that does not decode."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def signature(*, secret: str, message_id: str, timestamp: int, body: str) -> str:
    digest = hmac.new(
        secret_bytes(secret), f"{message_id}.{timestamp}.{body}".encode(), hashlib.sha256
    ).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")
