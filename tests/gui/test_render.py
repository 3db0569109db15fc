"""Exact text: what a message says is what the window shows (the `<` bug first)."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtGui import QGuiApplication, QTextDocument

from gui.message_view import MessageView
from gui.render import assistant_html, code_blocks, user_html, visible_text

CPP = "In C++, what does std::vector<int> v; declare?"


def shown(view: MessageView) -> str:
    """The plain text of the document the view's label renders."""
    doc = QTextDocument()
    doc.setHtml(view.body.text())
    return doc.toPlainText()


def squash(s: str) -> str:
    # Qt turns non-breaking spaces and paragraph separators into plain whitespace and
    # Markdown folds runs of blanks: compare words, not the blanks between them.
    return " ".join(s.split())


def test_angle_brackets_survive_in_both_roles(app) -> None:
    for role in ("user", "assistant"):
        v = MessageView(role, CPP)
        assert CPP in shown(v), role
    raw = "<script>alert(1)</script> <b>not bold</b> &amp;"
    assert squash(raw) in squash(shown(MessageView("assistant", raw)))
    assert "<b>" not in assistant_html(raw)  # escaped, never interpreted


def test_user_text_keeps_line_breaks_and_markup_characters(app) -> None:
    text = "line one\nline two\n__init__ and *args, **kwargs\n  indented"
    assert shown(MessageView("user", text)) == text


def test_code_block_has_language_label_and_copy(app) -> None:
    text = "Here:\n\n```cpp\nstd::map<int, std::string> m;\n```\nDone."
    v = MessageView("assistant", text)
    page = shown(v)
    assert "cpp" in page and "Copy" in page and "std::map<int, std::string> m;" in page
    v._on_link("copy:0")
    assert QGuiApplication.clipboard().text() == "std::map<int, std::string> m;"
    v.copy_button.click()
    assert QGuiApplication.clipboard().text() == text
    assert code_blocks(text) == ["std::map<int, std::string> m;"]


# Random text with the characters that break renderers: markup, HTML, LaTeX, RTL, emoji.
# Control characters other than newline and tab are left out: Qt's document drops them.
ALPHABET = st.one_of(
    st.sampled_from(list("<>&`*_#[]()!\\$|~-+=.:\"' \n\t") + ["<b>", "</div>", "&amp;",
                    "```", "\\frac{a}{b}", "שלום", "مرحبا", "😀", "👩‍💻", "\u200f"]),
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")),
)
TEXTS = st.lists(ALPHABET, max_size=60).map("".join)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXTS)
def test_property_rendered_text_contains_the_message(app, text: str) -> None:
    # User: every character, in order (blanks compared as words).
    doc = QTextDocument()
    doc.setHtml(user_html(text))
    assert squash(text) in squash(doc.toPlainText())
    # Assistant: every piece the Markdown parser keeps as text (markup itself is consumed),
    # in order, appears in the rendered document.
    doc.setHtml(assistant_html(text))
    page = squash(doc.toPlainText())
    pos = 0
    for piece in visible_text(text):
        for word in squash(piece).split(" "):
            if not word:
                continue
            at = page.find(word, pos)
            assert at >= 0, (word, page)
            pos = at + len(word)


def test_raw_html_is_never_a_tag_in_the_label(app) -> None:
    html = assistant_html('<img src="x" onerror="y"> <a href="javascript:z">x</a>')
    assert not re.search(r"<(img|a)\b", html)
