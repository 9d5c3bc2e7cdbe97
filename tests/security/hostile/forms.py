"""Form posts: signup, the user login and the admin's login, then a superuser's admin forms."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from urllib.parse import quote

from tests.security.hostile.base import (
    CSRF_COOKIE,
    FORM_TYPE,
    STRONG,
    Corpus,
    Pairs,
    login_form,
    signup_form,
    without,
)

MakeForm = Callable[..., list[tuple[str, str]]]
TOKEN = "csrfmiddlewaretoken"
BOUNDARY = "multipart/form-data; boundary=B"
PART = '--B\r\nContent-Disposition: form-data; name="{}"\r\n\r\n{}\r\n'
UPLOAD = (
    '--B\r\nContent-Disposition: form-data; name="{}"; filename="../../x.py"\r\n'
    "Content-Type: text/x-python\r\n\r\nimport os\r\n--B--\r\n"
)
NEXT_TARGETS = [
    "https://evil.example/",
    "//evil.example/",
    "javascript:alert(1)",
    "/%09/evil.example",
    "/\\evil.example",
    "\x00",
]
GARBAGE_PKS = ["abc", "99999999999999999999", "-1", "\x00", "1.5", ""]


def form_posts(c: Corpus) -> None:
    csrf_variants(c, "/accounts/signup/", signup_form(c))
    csrf_variants(c, "/accounts/login/", login_form(c))
    csrf_variants(c, "/admin/login/", login_form(c))
    signup_fields = ("username", "email", "password1", "password2")
    form_fields(c, "/accounts/signup/", signup_form, signup_fields, heavy=True)
    # The password last: "one field repeated 500 times" repeats the user name,
    # not a password to hash.
    form_fields(c, "/accounts/login/", login_form, ("password", "username"))
    form_fields(c, "/admin/login/", login_form, ("password", "username"))
    for name in ("\uff41\uff44\uff4d\uff49\uff4e",):
        n = c.next()
        values = {"username": f"{name}{n}", "email": f"f{n}@example.com"}
        form = signup_form(c, **values, password1=STRONG, password2=STRONG)
        why = "/accounts/signup/: a valid signup with a look-alike name"
        c.add("form", why, "POST", "/accounts/signup/", headers=[CSRF_COOKIE, FORM_TYPE], form=form)
    for path in ("/accounts/login/", "/admin/login/"):
        for target in NEXT_TARGETS:
            c.add(
                "form",
                f"{path}: next={target!r}",
                "POST",
                path + "?next=" + quote(target, safe=""),
                headers=[CSRF_COOKIE, FORM_TYPE],
                form=login_form(c, next=target),
            )
    # The rate limit's own answer: one address, one name, one try past the budget
    # (the limit counts attempts, so empty passwords spare the hashing).
    for path, source in (("/accounts/login/", "127.0.0.2"), ("/admin/login/", "127.0.0.3")):
        for i in range(11):
            c.add(
                "form",
                f"{path}: a login as admin, try {i + 1} of 11 from one address",
                "POST",
                path,
                headers=[CSRF_COOKIE, FORM_TYPE],
                form=login_form(c, username="admin"),
                source=source,
            )


def csrf_variants(c: Corpus, path: str, fields: Pairs) -> None:
    def post(why: str, form: Pairs, headers: Pairs = (CSRF_COOKIE,)) -> None:
        c.add("form", f"{path}: {why}", "POST", path, headers=[*headers, FORM_TYPE], form=form)

    bare = without(fields, TOKEN)
    post("no CSRF cookie, no token", bare, headers=())
    post("the CSRF cookie without the token", bare)
    post("the token without the cookie", fields, headers=())
    post("a token that is not the cookie's", [*bare, (TOKEN, "a" * 32)])
    post("a 3-character token", [*bare, (TOKEN, "abc")])
    post("a token of punctuation", [*bare, (TOKEN, "!" * 32)])
    post("a 64-character garbage token", [*bare, (TOKEN, "z" * 64)])
    post("a garbage token, then the right one", [(TOKEN, "b" * 32), *fields])
    post("the right token, then a garbage one", [*fields, (TOKEN, "b" * 32)])
    punctuation = [("Cookie", "csrftoken=" + "!" * 32)]
    post("a cookie and token of punctuation", [*bare, (TOKEN, "!" * 32)], headers=punctuation)
    header = [CSRF_COOKIE, ("X-CSRFToken", "{csrftoken}")]
    post("the token in X-CSRFToken instead", bare, headers=header)
    post("a foreign Origin", fields, headers=[CSRF_COOKIE, ("Origin", "http://evil.example")])
    post("Origin: null", fields, headers=[CSRF_COOKIE, ("Origin", "null")])
    post("a NUL in the cookie", fields, headers=[("Cookie", "csrftoken=%00{csrftoken}")])


def form_fields(
    c: Corpus, path: str, make: MakeForm, names: Sequence[str], *, heavy: bool = False
) -> None:
    """Field values, repeats and encodings, each with a valid CSRF token.

    ``heavy`` adds the 70 KB bodies, sent to one form only.
    """

    def post(why: str, form: Pairs) -> None:
        c.add("form", f"{path}: {why}", "POST", path, headers=[CSRF_COOKIE, FORM_TYPE], form=form)

    def body(why: str, text: str, content_type: str = FORM_TYPE[1]) -> None:
        headers = [CSRF_COOKIE, ("Content-Type", content_type)]
        c.add("form", f"{path}: {why}", "POST", path, headers=headers, body=text)

    for name in names:
        post(f"a NUL in {name}", make(c, **{name: "a\x00b"}))
        post(f"a 10,000-character {name}", make(c, **{name: "a" * 10_000}))
        post(f"{name} repeated with two values", [*make(c), (name, "second")])
        post(f"{name}[] instead of {name}", [(f"{k}[]" if k == name else k, v) for k, v in make(c)])
        post(f"{name} empty", make(c, **{name: ""}))
        post(f"{name} missing", without(make(c), name))
    if heavy:
        post(
            "a 70,000-character field (past the upload limit)", make(c, **{names[0]: "a" * 70_000})
        )
    post("1,001 fields", [*make(c), *((f"f{i}", "1") for i in range(1001))])
    post("one field repeated 500 times", [*make(c), *((names[-1], "x") for _ in range(500))])
    post("a NUL in a field name", [*make(c), ("user\x00name", "x")])
    # Only in values already there: an empty password stays empty (no hashing).
    rtl = [(k, "\u202e" + v if v else v) for k, v in make(c)]
    post("a right-to-left override in every value", rtl)
    crlf = [(k, v + "\r\nBcc: x@example.com" if v else v) for k, v in make(c)]
    post("CRLF in every value", crlf)
    # Every one of these forms has a user name: odd bytes reach its lookup.
    first, last, token = "username", names[-1], f"{TOKEN}={{csrftoken}}"
    encoded = {
        "an invalid percent escape": f"{token}&{first}=%zz%",
        "percent-encoded invalid UTF-8": f"{token}&{first}=%ff%fe",
        "an overlong UTF-8 NUL": f"{token}&{first}=%c0%80",
        "an encoded surrogate": f"{token}&{first}=%ed%a0%80",
        "a trailing percent": f"{token}&{first}=a%",
        "semicolons as separators": f"{token};{first}=a;{last}=b",
        "only separators": f"{token}&&&===&&",
        "a key without a value": f"{token}&{first}",
        "plus signs and spaces": f"{token}&{first}=+a+b++",
        "an empty body": "",
    }
    for why, text in encoded.items():
        body(why, text)
    small = f"{token}&{first}=a"
    for charset in ("utf-16", "latin-1", "bogus", "UTF-8"):
        body(f"a body with charset={charset}", small, f"{FORM_TYPE[1]}; charset={charset}")
    body("a form body sent as text/plain", small, "text/plain")
    body("a form body sent as JSON", small, "application/json")
    fields = "".join(PART.format(k, v) for k, v in make(c))
    body("a well-formed multipart body", fields + "--B--\r\n", BOUNDARY)
    body("multipart without its closing boundary", fields, BOUNDARY)
    body("multipart without a boundary", fields + "--B--\r\n", "multipart/form-data")
    body("multipart with an empty boundary", fields, "multipart/form-data; boundary=")
    body("multipart with a 5,000-character boundary", fields, BOUNDARY + "B" * 4999)
    body("multipart with charset=utf-16", fields + "--B--\r\n", BOUNDARY + "; charset=utf-16")
    body("a file upload in place of a field", fields + UPLOAD.format(first), BOUNDARY)
    if heavy:
        many = "".join(PART.format(f"f{i}", "1") for i in range(1100))
        body("multipart with 1,100 parts", fields + many + "--B--\r\n", BOUNDARY)
    files = "".join(
        f'--B\r\nContent-Disposition: form-data; name="f{i}"; filename="f{i}"\r\n\r\nx\r\n'
        for i in range(120)
    )
    body("multipart with 120 files", fields + files + "--B--\r\n", BOUNDARY)


def admin_posts(c: Corpus) -> None:
    """A logged-in superuser's forms with a valid token, fed garbage (nothing destroyed)."""

    def post(why: str, path: str, form: Pairs) -> None:
        fields = [(TOKEN, "{csrftoken}"), *form]
        c.add("admin-forms", why, "POST", path, who="staff", headers=[FORM_TYPE], form=fields)

    jobs = "/admin/jobs/job/"
    for action in ("retry_selected", "cancel_selected", "delete_selected_in_batches", "nope", ""):
        for pk in GARBAGE_PKS:
            why = f"job action {action!r} on selected {pk!r}"
            post(why, jobs, [("action", action), ("_selected_action", pk)])
    every_row = [("action", "delete_selected_in_batches"), ("select_across", "1"), ("index", "0")]
    post("a job action across every row, unconfirmed", jobs, every_row)
    for index in ("abc", "99", "-1"):
        form = [("action", "retry_selected"), ("index", index), ("_selected_action", "1")]
        post(f"a job action with index={index}", jobs, form)
    post("select_across=abc", jobs, [("action", "cancel_selected"), ("select_across", "abc")])
    for path in ("/admin/auth/user/", "/admin/auth/group/", "/admin/jobs/effectrecord/"):
        for pk in ("abc", "99999999999999999999", "\x00"):
            form = [("action", "delete_selected"), ("_selected_action", pk)]
            post(f"delete_selected on {pk!r}", path, form)
    new_users = {
        "a NUL user name": {"username": "a\x00b", "password1": "x", "password2": "x"},
        "a 10,000-character name": {"username": "a" * 10_000, "password1": "x", "password2": "y"},
        "mismatched passwords": {"username": "adminadd", "password1": STRONG, "password2": "no"},
        "usable_password garbage": {"username": "adminadd2", "usable_password": "maybe"},
        "_popup with _to_field=password": {"_popup": "1", "_to_field": "password"},
    }
    for why, values in new_users.items():
        post(f"add user: {why}", "/admin/auth/user/add/", list(values.items()))
    for value in ("abc", "99999999999999999999", "-1", "\x00", ""):
        form = [("name", f"g{c.next()}"), ("permissions", value)]
        post(f"add group with permissions={value!r}", "/admin/auth/group/add/", form)
    post("add group with a NUL name", "/admin/auth/group/add/", [("name", "a\x00")])
    for pk in ("abc", "99999999999999999999", "-1", "%00", "1.5"):
        form = [("username", "x"), ("is_superuser", "on")]
        post(f"change user {pk!r}", f"/admin/auth/user/{pk}/change/", form)
        form = [("password1", "x"), ("password2", "y")]
        post(f"set the password of user {pk!r}", f"/admin/auth/user/{pk}/password/", form)
    mismatched = [("password1", STRONG), ("password2", STRONG + "x")]
    post(
        "the staff user's password, mismatched", "/admin/auth/user/{staff_id}/password/", mismatched
    )
    wrong_old = [("old_password", "wrong"), ("new_password1", STRONG), ("new_password2", STRONG)]
    post("password change with a wrong old password", "/admin/password_change/", wrong_old)
    for queue, verb in (("default", "explode"), ("nope", "pause"), ("x" * 300, "pause"),
                        ("..", "pause"), ("default", "resume")):  # fmt: skip
        path = f"/admin/jobs/job/dashboard/queue/{quote(queue)}/{verb}/"
        post(f"queue control {queue[:20]!r} {verb!r}", path, [])
    for actor in ("nope", "x" * 300, "%2e%2e", "%00"):
        post(f"run now {actor[:20]!r}", f"/admin/jobs/job/schedules/{actor}/run/", [])
    for pk in ("1", "0", "99999999999999999999", "-1", "abc"):
        for verb in ("cancel", "retry"):
            post(f"{verb} job {pk!r}", f"/admin/jobs/job/{pk}/{verb}/", [])
    for actor, verb, cron in (
        ("daily_report", "edit", "* * * * * *"),
        ("daily_report", "edit", ",".join(map(str, range(60))) + " * * * *"),
        ("daily_report", "edit", "0 0 31 4 *"),
        ("daily_report", "edit", "\x00"),
        ("nope", "enable", ""),
        ("daily_report", "explode", ""),
        ("x" * 300, "reset", ""),
    ):
        path = f"/admin/jobs/job/schedules/{quote(actor)}/{verb}/"
        post(f"schedule {actor[:20]!r} {verb!r} {cron[:20]!r}", path, [("cron", cron)])
    for name, query in (
        ("retry", "nosuchfield=1"),
        ("delete", "enqueued_at__gte=notadate"),
        ("cancel", "q=user_id%3D" + "9" * 400 + ".5"),
        ("explode", ""),
        ("retry", "state__exact=%00"),
    ):
        post(f"bulk {name} with {query[:30]!r}", f"/admin/jobs/job/bulk/{name}/?{query}", [])
    for pk in ("1", "abc", "99999999999999999999"):
        post(f"delete audit entry {pk!r}", f"/admin/jobs/auditentry/{pk}/delete/", [])
    for fields in (
        [("template", "order:{order_id}"), ("limit", "-1")],
        [("template", "order:{order_id}"), ("limit", "9" * 400)],
        [("template", "\x00"), ("limit", "2")],
        [("template", "x" * 5000), ("limit", "")],
        [("pattern", "*"), ("limit", "1e9")],
        [("pattern", "a\nb"), ("limit", "2")],
        [("pattern", "x" * 300), ("limit", "2")],
        [("limit", "2")],
    ):
        post(f"concurrency limit {fields!r:.40}", "/admin/jobs/job/limits/change/", fields)
    for user_id in ("{staff_id}", "0", "99999999999999999999"):
        c.add(
            "admin-forms",
            f"export user {user_id}",
            "POST",
            f"/api/users/{user_id}/export/",
            who="staff",
            headers=[("X-CSRFToken", "{csrftoken}")],
        )
