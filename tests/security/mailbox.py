"""The emails Django's file backend wrote: counted, and read as a person would read them.

A secret can hide from a plain text search in an email: a long line makes
Django send the body quoted-printable, an attachment is base64. ``readable``
gives the raw message and every part decoded, so the search sees both.
"""

from __future__ import annotations

import email
from email import policy
from email.message import EmailMessage
from pathlib import Path

# django.core.mail.backends.filebased writes each message followed by this line.
SEPARATOR = b"-" * 79 + b"\n"


def messages(directory: Path) -> list[EmailMessage]:
    found: list[EmailMessage] = []
    for path in sorted(directory.glob("*")):
        for chunk in path.read_bytes().split(SEPARATOR):
            if chunk.strip():
                found.append(email.message_from_bytes(chunk, policy=policy.default))
    return found


def readable(message: EmailMessage) -> str:
    texts = [message.as_string()]
    for part in message.walk():
        if part.is_multipart():
            continue
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            texts.append(payload.decode("utf-8", "replace"))
    return "\n".join(texts)
