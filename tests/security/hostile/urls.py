"""Every method on every URL, hostile paths, and the admin's change lists' query strings.

The URLs are those of project/urls.py, accounts/urls.py, accounts/api_urls.py,
jobs/urls.py and the admin; ``test_the_corpus_sends_requests_to_every_url_of_the_project``
fails when one is added that no request here reaches.
"""

from __future__ import annotations

from tests.security.hostile.base import Corpus

MODELS = "auth/group auth/user jobs/job jobs/dailyreport jobs/effectrecord django_dramatiq/task"
URLS = [
    "/",
    "/accounts/",
    "/accounts/login/",
    "/accounts/logout/",
    "/accounts/signup/",
    "/accounts/signup/done/",
    "/api/signup/",
    "/api/users/1/",
    "/api/users/1/export/",
    "/api/tasks/abc/",
    "/api/tasks/abc/download/",
    "/admin/",
    "/admin/login/",
    "/admin/logout/",
    "/admin/password_change/",
    "/admin/password_change/done/",
    "/admin/autocomplete/",
    "/admin/jsi18n/",
    "/admin/r/1/1/",
    "/admin/auth/",
    "/admin/jobs/",
    "/admin/django_dramatiq/",
    "/admin/nope/",
    "/healthz",
    "/metrics",
    "/static/admin/css/base.css",
    "/favicon.ico",
    *(
        f"/admin/{model}/{tail}"
        for model in MODELS.split()
        for tail in ("", "add/", "1/", "1/change/", "1/delete/", "1/history/")
    ),
    "/admin/auth/user/1/password/",
    "/admin/jobs/job/dashboard/",
    "/admin/jobs/job/schedules/",
    "/admin/jobs/job/workers/",
    "/admin/jobs/job/limits/",
    "/admin/jobs/job/limits/change/",
    "/admin/jobs/job/schedules/nope/run/",
    "/admin/jobs/job/schedules/daily_report/edit/",
    "/admin/jobs/job/bulk/retry/?q=user_id%3D7",
    "/admin/jobs/job/bulk/delete/?o=abc&p=999999",
    "/admin/jobs/auditentry/",
    "/admin/jobs/auditentry/?q=%00",
    "/admin/jobs/auditentry/abc/",
    "/admin/jobs/auditentry/1/change/",
    "/admin/jobs/auditentry/1/history/",
    "/admin/jobs/auditentry/add/",
    "/admin/jobs/job/dashboard/queue/default/pause/",
    "/admin/jobs/job/1/cancel/",
    "/admin/jobs/job/1/retry/",
]
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT", "FOO"]
ODD_METHODS = ["PROPFIND", "get", "M" * 40, "G\u00c9T", "GET\x00"]
# A logged-in superuser: methods that cannot log them out or change anything
# (their POST carries no CSRF token).
STAFF_METHODS = ["GET", "HEAD", "POST", "OPTIONS"]

PATHS = [
    "/../../../../etc/passwd",
    "/static/../../../../etc/passwd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/static/..%2f..%2f..%2fproject%2fsettings.py",
    "/static/%2e%2e/%2e%2e/project/settings.py",
    "/static/%252e%252e/%252e%252e/project/settings.py",
    "/static/..\\..\\project\\settings.py",
    "/static/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd",
    "/static/admin/../../../manage.py",
    "/static/admin/css/base.css%00.png",
    "/static/admin/css/base.css/..",
    "/static/staticfiles.json",
    "/static/./admin/css/base.css",
    "/static/admin/css/BASE.CSS",
    "/static/admin/css/base.css.gz",
    "/staticfiles/",
    "/.env",
    "/.git/config",
    "/var/db.sqlite3",
    "/db.sqlite3",
    "/project/settings.py",
    "/gunicorn.conf.py",
    "/wp-login.php",
    "/cgi-bin/test.cgi",
    "/admin/../accounts/signup/",
    "/admin/%2e%2e/accounts/",
    "/accounts/signup/..;/..;/admin/",
    "/api/signup/%2e%2e/%2e%2e/admin/",
    "/%2fadmin/",
    "//admin/",
    "///accounts//signup//",
    "/admin//auth//user//",
    "/accounts/signup/%00",
    "/%00",
    "/api/%00/",
    "/admin/%00/",
    "/accounts/signup%00/",
    "/api/users/1%00/",
    "/healthz%00",
    "/metrics%00",
    "/%2500",
    "/%25%30%30",
    "/%252e%252e%252f",
    "/%25%32%65",
    "/accounts/sign%C3%BCp/",
    "/%ff%fe/",
    "/%ed%a0%80/",
    "/%c0%80/",
    "/accounts/%E2%80%AEsignup/",
    "/accounts/signup/?%00=%00",
    "/accounts/signup/#fragment",
    "/accounts/signup/?a=%ff%fe&b=%c0%80",
    "/accounts/signup/?#",
    "/accounts/login/?next=//evil.example",
    "/accounts/login/?next=https://evil.example",
    "/accounts/login/?next=javascript:alert(1)",
    "/accounts/login/?next=/\\evil.example",
    "/admin/login/?next=%2F%2Fevil.example",
    "/admin/login/?next=%00",
    "/accounts/logout/?next=//evil.example",
    "/admin/r/abc/def/",
    "/admin/r/1/abc/",
    "/admin/r/99999999999999999999/1/",
    "/admin/r/%00/%00/",
    "/admin/r/1/99999999999999999999/",
    "/admin/r/4/1/",
    "/admin/r/1/1/../../",
    "/admin/r/-1/-1/",
    "/admin/r/" + "9" * 1000 + "/1/",
    "/accounts/sign\u00fcp/",
    "/\uff41\uff44\uff4d\uff49\uff4e/",
    "/admin/\u202e/",
    "/\U0001f600/",
    *("/" + "a" * size for size in (2000, 4000, 5000, 9000)),
    "/admin/" + "a/" * 1500,
    "/?" + "a=b&" * 900,
    "/accounts/signup/?" + "a=b&" * 1001,
]
GARBAGE_IDS = [
    "abc",
    "%00",
    "'%20OR%20'1'='1",
    "..%2f..%2f",
    "%2e%2e",
    "%3Cscript%3E",
    "%ff",
    "%F0%9F%98%80",
    "00000000-0000-0000-0000-000000000000",
    "%0d%0aSet-Cookie:%20x=y",
    "{{7*7}}",
    "%25",
    "null",
    "-1",
    "1e999",
    "%20",
    "%09",
    "a" * 300,
    "a" * 3000,
]
USER_IDS = [
    "0",
    "00000001",
    "-1",
    "%D9%A1%D9%A2%D9%A3",
    "1.5",
    "1e3",
    "0x10",
    "%201",
    "1%20",
    *(str(n) for n in (2**31, 2**63 - 1, 2**63, 2**64)),
    *("9" * size for size in (20, 100, 1000, 4000)),
]
REQUEST_TARGETS = [
    ("http://evil.example/admin/", "GET"),
    ("http://127.0.0.1/api/users/1/", "GET"),
    ("https://127.0.0.1/accounts/signup/", "GET"),
    ("*", "OPTIONS"),
    ("*", "GET"),
    ("127.0.0.1:80", "CONNECT"),
    ("admin/", "GET"),
    ("?a=b", "GET"),
    ("#frag", "GET"),
]

CHANGELISTS = [
    "/admin/jobs/job/",
    "/admin/jobs/dailyreport/",
    "/admin/jobs/effectrecord/",
    "/admin/auth/user/",
    "/admin/auth/group/",
]
COMMON_QUERIES = [
    "o=999",
    "o=-999",
    "o=abc",
    "o=1.2.999",
    "o=",
    "o=-0",
    "o=1.1.1.1.1.1",
    "p=-1",
    "p=abc",
    "p=99999999",
    "p=1e9",
    "p=0",
    "e=1",
    "all=",
    "q=%00",
    "q=%ff%fe",
    "q=%E2%80%AE",
    "q=%27%20OR%201=1--",
    "q=%5C",
    "q=%25",
    "q=_",
    "_changelist_filters=%00",
    "_changelist_filters=o%3D999",
    "_popup=1",
    "_to_field=password",
    "_to_field=id&_popup=1",
    "%00=1",
    "a=1",
    "id__gt=abc",
    "pk__in=1,abc",
    "password__startswith=pbkdf2",
    "o=1&o=2",
    "p=1&p=2",
    "q=a&q=b",
    "q=" + "a" * 2000,
    "x=1&" * 1001,
]
SPECIFIC_QUERIES = {
    "/admin/jobs/job/": [
        "state=%00",
        "state=garbage",
        "actor=%00",
        "actor=nope",
        "queue=%00",
        "queue=..%2f",
        "subject=%00",
        "subject=auth.user:%00",
        "subject=auth.user:1",
        "subject=nope",
        "subject=a.b:c:d:e",
        "enqueued_at__gte=garbage",
        "enqueued_at__gte=2020-13-45",
        "enqueued_at__gte=%00",
        "enqueued_at__lt=99999-01-01",
        "q=00000000-0000-0000-0000-000000000000",
        "q=AUTH.USER:1",
        "q=auth.user:%00",
        "state=failed&actor=nope&queue=nope&o=-3.7",
        "state=" + "a" * 3000,
        "actor=" + "%C3%BC" * 500,
        "subject=" + "a" * 3000,
        "subject=auth.user:" + "9" * 100,
        "q=auth.user:" + "9" * 50,
    ],
    "/admin/jobs/dailyreport/": [
        "date__year=abc",
        "date__year=99999",
        "date__month=13&date__year=2020",
        "date__year=-1",
        "date__day=0&date__month=2&date__year=2021",
        "date__year=2020&date__month=2&date__day=30",
    ],
    "/admin/jobs/effectrecord/": ["state=%00", "state=x", "q=" + "k" * 1000],
    "/admin/auth/user/": [
        "is_staff__exact=abc",
        "is_superuser__exact=2",
        "is_active__exact=%00",
        "groups__id__exact=abc",
        "groups__id__exact=99999999999999999999",
    ],
    "/admin/auth/group/": ["q=x"],
}
STAFF_PAGES = [
    "/admin/jobs/job/dashboard/?range=abc",
    "/admin/jobs/job/dashboard/?q=%00",
    "/admin/jobs/job/schedules/?o=abc",
    "/admin/jobs/job/workers/?p=-1",
    "/admin/autocomplete/?app_label=auth&model_name=user&field_name=groups&term=%00",
    "/admin/autocomplete/?app_label=%00",
    "/admin/autocomplete/?app_label=auth&model_name=group&field_name=permissions&term=a",
    "/admin/autocomplete/?app_label=x&model_name=y&field_name=z",
    "/admin/jsi18n/?language=%00",
    "/admin/jsi18n/?packages=x",
    "/admin/auth/user/abc/change/",
    "/admin/auth/user/%00/change/",
    "/admin/auth/user/-1/change/",
    "/admin/auth/user/99999999999999999999/change/",
    "/admin/auth/user/1.5/change/",
    "/admin/auth/user/1%20OR%201=1/change/",
    "/admin/jobs/job/abc/change/",
    "/admin/jobs/job/99999999999999999999/change/",
    "/admin/jobs/job/%2e%2e/change/",
    "/admin/jobs/dailyreport/abc/",
    "/admin/auth/group/abc/delete/",
    "/admin/auth/user/{staff_id}/change/",
    "/admin/auth/user/{staff_id}/password/",
    "/admin/auth/user/{staff_id}/history/",
    "/admin/auth/user/{staff_id}/delete/",
    "/admin/auth/user/{staff_id}/change/?_changelist_filters=o%3D999",
    "/admin/auth/user/{staff_id}/delete/?_popup=1&_to_field=password",
    "/admin/jobs/job/dashboard/?" + "x=1&" * 1001,
    "/admin/autocomplete/?term=" + "a" * 2000,
]


def methods(c: Corpus) -> None:
    for url in URLS:
        for method in METHODS:
            c.add("methods", f"{method} {url}", method, url)
        for method in STAFF_METHODS:
            c.add("methods", f"{method} {url} as staff", method, url, who="staff")
    for url in ("/", "/api/signup/", "/admin/", "/accounts/login/"):
        for method in ODD_METHODS:
            c.add("methods", f"{method[:10]!r} {url}", method, url)


def paths(c: Corpus) -> None:
    for path in PATHS:
        c.add("paths", f"path {path[:60]!r}", "GET", path)
    for task_id in GARBAGE_IDS:
        for tail in ("", "download/"):
            path = f"/api/tasks/{task_id}/{tail}"
            c.add("paths", f"task id {task_id[:30]!r}", "GET", path)
            c.add("paths", f"task id {task_id[:30]!r}, logged in", "GET", path, who="staff")
    for user_id in USER_IDS:
        profile, export = f"/api/users/{user_id}/", f"/api/users/{user_id}/export/"
        c.add("paths", f"user id {user_id[:30]}", "GET", profile)
        c.add("paths", f"export of user id {user_id[:30]}", "POST", export)
        c.add("paths", f"user id {user_id[:30]}, logged in", "GET", profile, who="staff")
    for target, method in REQUEST_TARGETS:
        c.add("paths", f"request target {target!r}", method, target)


def admin_queries(c: Corpus) -> None:
    for changelist in CHANGELISTS:
        queries = COMMON_QUERIES + SPECIFIC_QUERIES[changelist]
        for query in queries:
            why = f"{changelist} ?{query[:60]} as staff"
            c.add("admin-query", why, "GET", f"{changelist}?{query}", who="staff")
        for query in queries[::4]:  # anonymous: redirected to the login, a sample is enough
            c.add("admin-query", f"{changelist} ?{query[:60]}", "GET", f"{changelist}?{query}")
    for page in STAFF_PAGES:
        c.add("admin-query", f"{page[:70]} as staff", "GET", page, who="staff")
