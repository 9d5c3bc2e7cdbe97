"""Dramatiq's ``Callbacks`` (``on_success`` / ``on_failure`` actor options),
whose failure callback gets the error's text as the ledger records it.

Dramatiq's own hook sends ``str(exception)``: an exception whose ``__str__``
raises made the hook raise, and no ``on_failure`` callback was sent at all; and
a secret the job was given, quoted in its error, went into the callback's
message unmasked.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy

from jobs.middleware.ledger import error_text


class Callbacks(dramatiq.middleware.Callbacks):
    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is None:
            super().after_process_message(broker, message, result=result)  # type: ignore[no-untyped-call]
            return
        actor = broker.get_actor(message.actor_name)
        target = message.options.get("on_failure") or actor.options.get("on_failure")
        if target:
            failure = {"type": type(exception).__name__, "message": error_text(message, exception)}
            broker.get_actor(target).send(message.asdict(), failure)
