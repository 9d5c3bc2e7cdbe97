"""Per-key concurrency and fair queueing (``jobs.concurrency``): the actor
options, and the slot of a job freed as soon as it ends.

The slot is taken with the job by the worker's fetch (or by the consumer right
after it, ``jobs.broker.acks``), before the job reaches a worker thread; here
it is freed after the job ran or was skipped (cancelled, paused, expired),
which hands it to the oldest parked job.

Worker threads do not free slots themselves: each release would be a round
trip per job. They hand it to this process's ``job-slots`` thread, which sends
every release pending in one script call: within a few milliseconds when a
key of theirs has jobs waiting for its slots, within ``LAZY_GATHER``
otherwise. Where acks wait for the job ledger, the pending releases also ride
with the acks' round trip (``ride_along``); while that goes often, the thread
leaves them to it for up to ``RIDE_GATHER``. A release Redis could not take
stays pending and is sent again: its holder is alive, so no verdict would ever
free that slot. The same thread frees, once a second, the slots of dead
workers and starts the jobs parked behind them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq.broker import Broker, MessageProxy

from jobs.concurrency import fairness, keys, slots

logger = logging.getLogger(__name__)

# Seconds between sweeps: a dead holder's slot is freed within the heartbeat
# timeout and this.
SWEEP_INTERVAL = 1.0
# Seconds between attempts while Redis refuses the pending releases.
RETRY_INTERVAL = 0.2
# Seconds between two warnings that Redis refused to free slots.
WARN_EVERY = 10.0
# Releases per script call: a script blocks Redis while it runs.
RELEASES_PER_CALL = 500
# Seconds the thread lets releases gather after the first: one round trip per
# job (woken by each) cost a third of the throughput of fast keyed jobs.
GATHER = 0.002
# Seconds releases gather while none of their keys has jobs waiting
# (``slots.waited_for``): nobody waits for those slots, and each wake-up of
# this thread is a hand-over of the GIL. Waking every 2 ms under a steady
# stream of keyed jobs cost them about a quarter of their throughput. A release
# of a key with jobs waiting ends the gathering at once.
LAZY_GATHER = 0.02
# Seconds a release nobody waits for may wait for the acks to carry it
# (``ride_along``) while the acks go often: they came within ``RIDING``
# seconds. Under a steady stream of fast keyed jobs the ledger writer's acks
# go every few tens of milliseconds, and take every release pending then.
# The thread's own call every ``LAZY_GATHER`` cost the jobs 5-10 % of their
# throughput in a worker process of 8 busy threads; the acks carry them at no
# cost. ``RIDING`` spans a light stream's acks too (one per ledger batch,
# ``JOBS_LEDGER_FLUSH_MS``, 200 ms as shipped): at 50 ms, a gap between two
# acks of 50-100 ms under load (2 processes x 8 threads, on two cores) made
# the thread send half the releases itself, each in a round trip of its own
# (1.6 us of its CPU a job).
RIDE_GATHER = 0.1
RIDING = 0.25


class Concurrency(dramatiq.Middleware):
    actor_options = {*keys.OPTIONS, fairness.OPTION}

    def __init__(self) -> None:
        self._pending: list[slots.Held] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._urgent = threading.Event()  # a pending release of a key jobs wait for
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Whether the thread takes releases: set as it starts, cleared under
        # ``_lock`` as it ends, so that none is added to a list nobody sends.
        self._accepting = False
        self._last_ride = 0.0  # (monotonic) when the acks last came for releases
        self._pending_since: float | None = None  # (monotonic) the oldest pending release's
        self._last_warning = float("-inf")  # (monotonic) of "Slots not freed yet"
        # Workers of this broker running in this process (tests run several
        # in one process): the thread serves them all, and ends with the last.
        self._workers: set[int] = set()
        # Held through a boot or a shutdown, its thread's start and join: two
        # workers booting at once each started a thread. (Not ``_lock``: the
        # thread takes that one while it sends what is pending, and a
        # shutdown waits for it to end.)
        self._lifecycle = threading.Lock()

    def before_declare_actor(self, broker: Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        # Before: a declaration that does not fit fails before the actor is
        # registered, so the module can be fixed and imported again.
        # Both checked before either is kept: a bad fairness key must not leave
        # the actor's concurrency key declared (its limit would bind others).
        fairness.register(actor)
        try:
            keys.register(actor)
        except Exception:
            fairness.forget(actor.actor_name)
            raise

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        keys.check_usable(message)  # (a job whose key's Redis data is of another type)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._release(broker, message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._release(broker, message)

    def _release(self, broker: Any, message: MessageProxy) -> None:
        held = keys.held_slot(message)
        if held is None:
            return
        with self._lock:
            accepting = self._accepting
            if accepting:
                self._pending.append(held)
                first = len(self._pending) == 1
                if first:
                    self._pending_since = time.monotonic()
        if not accepting:
            self._send(broker, [held])  # no releasing thread (yet, or any more)
            return
        if slots.waited_for(held.key):
            self._urgent.set()
        if first:
            self._wake.set()

    def release_later(self, held: list[slots.Held]) -> bool:
        """Releases Redis refused elsewhere (a consumer handing jobs back), for
        the job-slots thread to send until Redis takes them: the holder is this
        live worker, so no verdict would free those slots. False without a
        running thread (a worker shutting down)."""
        with self._lock:
            # (Under the lock: a thread ending between a check and the append
            # left them in a list nobody sent.)
            if not self._accepting:
                return False
            self._pending.extend(held)
            if self._pending_since is None:
                self._pending_since = time.monotonic()
        self._urgent.set()
        self._wake.set()
        return True

    def ride_along(self) -> list[slots.Held]:
        """Pending releases for a round trip another thread makes anyway (the
        ledger writer's acks, ``jobs.broker.acks``), which sends them with its
        own commands and hands back (``ride_back``) those Redis did not take.
        Under a steady stream of keyed jobs most releases go this way: the
        job-slots thread's own calls, one every ``LAZY_GATHER``, cost a worker
        process of 8 busy threads more than their Redis work (each a hand-over
        of the GIL around its socket waits). None without a job-slots thread
        to hand back to (a stopping worker sends its releases itself)."""
        if not self._accepting:
            return []
        # Whether or not it finds any: the acks go often (they are sent as jobs
        # end), so releases may wait for the next ones (``_gather``). Counting
        # only rides that took some, the thread's own sends, which left the
        # acks nothing, kept it sending.
        self._last_ride = time.monotonic()
        return self._take_batch()

    def _take_batch(self) -> list[slots.Held]:
        """Up to a script call's worth of pending releases, no longer pending."""
        with self._lock:
            batch = self._pending[:RELEASES_PER_CALL]
            del self._pending[:RELEASES_PER_CALL]
            if not self._pending:
                self._pending_since = None
        return batch

    def ride_back(self, held: list[slots.Held], broker: Any) -> None:
        """Releases a ride along did not deliver, for the job-slots thread; sent
        here if it has ended meanwhile (a worker stopping while its ledger
        writer sent the acks)."""
        if not held or self.release_later(held):
            return
        try:
            self._send(broker, held)  # (a script Redis lost is loaded again)
        except redis.RedisError as exc:
            # The verdict on this worker frees them once it stops beating.
            logger.warning("Slots of %d finished job(s) not freed: %s", len(held), exc)

    def before_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        # Before: the worker's consumer threads start during its boot, and one
        # may hand this thread releases at once (``release_later``).
        if not hasattr(broker, "namespace"):
            return  # a stub broker (tests): no Redis
        with self._lifecycle:
            with self._lock:
                self._workers.add(id(worker))
                running = self._thread is not None and self._thread.is_alive()
                if running and not self._stop.is_set():
                    return
            if self._thread is not None:
                self._thread.join(timeout=5)  # (one stopping: it sends what is pending first)
            self._stop.clear()
            with self._lock:
                self._accepting = True
            self._thread = threading.Thread(
                target=self._run, args=(broker,), name="job-slots", daemon=True
            )
            self._thread.start()

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        # After: the worker threads have ended, so every release is pending.
        with self._lifecycle:
            with self._lock:
                if id(worker) not in self._workers:
                    return  # stopped before, or never booted here
                self._workers.discard(id(worker))
                if self._workers:
                    return  # another worker of this process still runs jobs
                self._stop.set()
            self._urgent.set()
            self._wake.set()
            if self._thread is not None:
                self._thread.join(timeout=5)

    def _run(self, broker: Any) -> None:
        try:
            self._serve(broker)
        finally:
            with self._lock:
                self._closing()

    def _closing(self) -> None:
        """This thread takes no more releases (under ``_lock``): unless a newer
        one took over, after a stop that waited for it in vain."""
        if self._thread is threading.current_thread():
            self._accepting = False

    def _serve(self, broker: Any) -> None:
        cursors = {slots.PARKED_KEYS: 0, slots.SLOT_KEYS: 0}
        next_sweep = time.monotonic() + SWEEP_INTERVAL
        while True:
            send = True
            # (Releases left pending at the sweep's time gather on at once.)
            if self._pending or self._wake.wait(max(0.0, next_sweep - time.monotonic())):
                # Cleared first: the acks may take every pending release while
                # this thread gathers, and the next one sets it again.
                self._wake.clear()
                send = self._gather(until=next_sweep)
            self._urgent.clear()
            stopping = self._stop.is_set()
            # Refused by Redis (a release not sent is put back): tried again
            # after RETRY_INTERVAL. (Any other error lost its batch, as ever.)
            refused = (send or stopping) and self._refused(self._send_pending, broker)
            if stopping:
                if refused:
                    return  # the verdict on this worker frees them once it stops beating
                with self._lock:
                    if not self._pending:
                        self._closing()  # (with the check: nothing is added after)
                        return
                continue
            # In a pass of its own: a batch Redis keeps refusing held off the
            # sweep on every attempt, and with it every dead worker's slot and
            # the jobs parked behind.
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + SWEEP_INTERVAL
                self._refused(self._sweep, broker, cursors)
            if refused:
                self._stop.wait(RETRY_INTERVAL)
                self._wake.set()

    def _refused(self, step: Any, *args: Any) -> bool:
        """Run one step of a pass; whether Redis refused it (logged). Any other
        error is logged too: the thread must outlive any one pass."""
        try:
            step(*args)
        except redis.RedisError as exc:
            # Once in WARN_EVERY: the thread tries again every RETRY_INTERVAL,
            # five lines a second through a failover's read-only minute.
            now = time.monotonic()
            if now - self._last_warning >= WARN_EVERY:
                self._last_warning = now
                logger.warning("Slots not freed yet, trying again: %s", exc)
            return True
        except Exception:
            logger.exception("Slot release failed")
        return False

    def _gather(self, until: float) -> bool:
        """Wait until the pending releases should go: within ``GATHER`` of one
        whose key jobs wait for; otherwise once the oldest has waited
        ``LAZY_GATHER``, or ``RIDE_GATHER`` while the acks keep coming
        (``ride_along``). Returns at once when the acks took them all. False
        if ``until`` (monotonic), the next sweep's time, came first: under a
        steady stream the acks take each release before it is due, and one is
        nearly always pending, so the gathering could go on for as long as
        the stream did, and no sweep with it."""
        while True:
            if not self._pending:
                return True
            now = time.monotonic()
            since = self._pending_since
            if since is None:  # (only for a moment: set as the first is added)
                since = self._pending_since = now
            riding = now - self._last_ride < RIDING
            due = since + (RIDE_GATHER if riding else LAZY_GATHER)
            if now >= due:
                return True
            if now >= until and not self._urgent.is_set():
                return False
            # Woken only when due (each wake-up is a hand-over of the GIL): acks
            # that stop meanwhile leave the release to wait RIDE_GATHER at most.
            if self._urgent.wait(max(0.0, min(due, until) - now)):
                break
        time.sleep(GATHER)
        return True

    def _send_pending(self, broker: Any) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                return
            try:
                self._send(broker, batch)
            except redis.RedisError:
                with self._lock:
                    self._pending[:0] = batch
                    if self._pending_since is None:
                        self._pending_since = time.monotonic()
                raise

    def _send(self, broker: Any, held: list[slots.Held]) -> None:
        slots.release(broker.client, broker.namespace, held, broker_id=broker.broker_id)

    def _sweep(self, broker: Any, cursors: dict[str, int]) -> None:
        """Keys with parked jobs first (jobs wait behind a dead holder), then a
        share of every key with slots (a dead holder's slots nobody waits for).
        Slots this worker holds under takes it has released (a release Redis
        lost) go too (``jobs.concurrency.takes``)."""
        started = 0
        for among, cursor in cursors.items():
            cursors[among], count = slots.sweep(
                broker.client,
                broker.namespace,
                timeout_ms=int(broker.heartbeat_timeout),
                cursor=cursor,
                among=among,
                broker_id=broker.broker_id,
            )
            started += count
        if started:
            logger.info("Started %d parked job(s) whose slots were freed by the sweep", started)
