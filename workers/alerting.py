"""Celery tasks of the alerts worker (queue `alerts`). Thin: take a delivery id, call
console.services.alert_routing.

`deliver_alert` is acks_late and safe to run twice: `alert_routing.deliver` claims the row before
it sends, so a message redelivered after a worker died, or re-queued by the sweep while the first
is on its way, sends nothing twice. A failed attempt is retried by the task itself after the
backoff the service computed (1 s doubling to 30 s); `sweep_alert_deliveries` (beat, every 5 s)
re-queues deliveries whose message was lost.
"""

from __future__ import annotations

from celery import shared_task

from console.services import alert_routing
from infra import tasks


@shared_task(**tasks.DELIVER_ALERT.options(bind=True))
def deliver_alert(self, delivery_id: int) -> str:
    """Make one attempt at delivery `delivery_id`; on failure, try again after the backoff."""
    retry_in_s = alert_routing.deliver(delivery_id)
    if retry_in_s is not None:
        raise self.retry(countdown=retry_in_s)
    return "done"


@shared_task(**tasks.SWEEP_ALERT_DELIVERIES.options())
def sweep_alert_deliveries() -> int:
    """Queue again the pending deliveries that are overdue; return how many."""
    due = alert_routing.due_deliveries()
    alert_routing.enqueue(due)
    return len(due)
