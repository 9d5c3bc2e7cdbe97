"""A paginator that never counts a whole large table.

Unfiltered, the ledger's size is estimated from its primary-key range (one index
lookup); filtered, rows are counted up to a cap. The admin list therefore costs
the same with a thousand rows as with millions.
"""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.db.models import Max, Min, QuerySet
from django.utils.functional import cached_property

COUNT_CAP = 10_000


class CheapCountPaginator(Paginator):  # type: ignore[type-arg]
    """``count`` is exact up to ``COUNT_CAP`` rows; past it, ``estimated`` (the id
    range, unfiltered) or ``capped`` (filtered: "more than") says so, and the
    list's pagination line shows it (admin/jobs/job/pagination.html)."""

    estimated = False
    capped = False

    @cached_property
    def count(self) -> int:
        queryset: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        if not queryset.query.where:
            # Two index lookups. One query with both MIN and MAX would make SQLite
            # scan the table: it optimises a lone min() or max() only.
            rows = queryset.model._default_manager.order_by()
            high = rows.aggregate(high=Max("pk"))["high"]
            if high is None:
                return 0
            low = rows.aggregate(low=Min("pk"))["low"]
            span = int(high - low + 1)
            if span > COUNT_CAP:
                self.estimated = True
                return span
            # Small: counted, so deleted rows (gaps in the ids) are not shown.
            return queryset.order_by().count()
        counted = queryset.order_by().values("pk")[: COUNT_CAP + 1].count()
        self.capped = counted > COUNT_CAP
        return counted
