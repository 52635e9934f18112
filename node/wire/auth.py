"""The client port's challenge: the node sends a nonce, the client answers with an HMAC of it."""

from __future__ import annotations

import hashlib
import hmac


def auth_digest(secret: str, nonce: bytes) -> bytes:
    """HMAC-SHA256(secret, nonce): what a client answers the challenge with."""
    return hmac.new(secret.encode("utf-8"), nonce, hashlib.sha256).digest()
