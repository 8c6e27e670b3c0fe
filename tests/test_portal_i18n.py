"""Every string of the portal's templates is in the Chinese catalogue, and no visible text escapes translation."""

import re
from pathlib import Path

from jinja2.ext import babel_extract

from caldera.server.web import i18n
from caldera.server.web.render import TEMPLATES

NOT_WORDS = {"Caldera"}  # the name is the same in every language


def template_messages() -> dict[str, str]:
    out = {}
    for path in sorted(TEMPLATES.glob("*.html")):
        with open(path, "rb") as fh:
            for lineno, _, msg, _ in babel_extract(fh, ("_", "gettext"), [], {}):
                out[msg] = f"{path.name}:{lineno}"
    return out


def test_every_template_string_is_translated():
    zh = i18n.translations("zh")
    messages = template_messages()
    assert len(messages) > 50
    same = {"Jupyter Lab"}  # a product name, the same in Chinese
    missing = [f"{where}: {msg!r}" for msg, where in messages.items() if zh.gettext(msg) == msg and msg not in same]
    assert not missing, "not in translations/zh/LC_MESSAGES/messages.po:\n" + "\n".join(missing)


def test_no_literal_text_outside_the_catalogue():
    """Text between tags must come from _(): strip Jinja and HTML and no word may be left."""
    found = []
    for path in sorted(TEMPLATES.glob("*.html")):
        text = path.read_text()
        for pattern in (r"{#.*?#}", r"{{.*?}}", r"{%.*?%}", r"<[^>]*>", r"&\w+;"):
            text = re.sub(pattern, " ", text, flags=re.S)
        found += [f"{path.name}: {w}" for w in re.findall(r"[A-Za-z]{2,}", text) if w not in NOT_WORDS]
    assert not found


def test_catalogue_placeholders_match():
    """A translation that drops or renames a %(name)s would raise when rendered."""
    catalogue = Path(i18n.po_path("zh")).read_text()
    zh = i18n.translations("zh")
    for msg in template_messages():
        assert set(re.findall(r"%\(\w+\)s", zh.gettext(msg))) == set(re.findall(r"%\(\w+\)s", msg)), msg
    assert 'msgstr ""\n\n' not in catalogue.split("\n\n", 1)[1]  # no empty translation


def test_every_api_error_shape_is_translated_with_its_values():
    """The API's English reasons the portal knows by shape (reason_text.SHAPES) each have a Chinese message with the
    same placeholders, and a real reason comes out in Chinese with its values kept."""
    from caldera.server.web.reason_text import SHAPES, Say

    zh = i18n.translations("zh")
    for _, msgid in SHAPES:
        assert zh.gettext(msgid) != msgid, msgid
        assert set(re.findall(r"%\(\w+\)s", zh.gettext(msgid))) == set(re.findall(r"%\(\w+\)s", msgid)), msgid
    got = Say(zh.gettext).english_reason("String should match pattern '^[a-z]+$'")
    assert got == "须符合格式 ^[a-z]+$"
    assert Say(str).english_reason("String should match pattern '^[a-z]+$'") == "must match the pattern ^[a-z]+$"
    assert Say(zh.gettext).english_reason("something new") == "something new"  # unknown: as the API said it


def test_a_form_error_reads_in_chinese(api, admin):
    from tests.portal import browser_for, field_errors, post_form

    me = browser_for(api.client, "admin", "admin-password")
    me.cookies.set(i18n.LANG_COOKIE, "zh")
    r = post_form(me, "/new/batch", {"name": "bad name!", "command": "true"})
    assert r.status_code == 400
    assert any(e.startswith("须符合格式") for e in field_errors(r.text, "name")), field_errors(r.text, "name")
