"""Message text -> the HTML a QLabel shows, keeping every character the user or model wrote.

User messages are plain text: HTML-escaped, line breaks and runs of spaces kept. Assistant
messages are CommonMark (markdown-it-py) with raw HTML switched off, so ``<int>`` or
``<script>`` arrive as text; fenced code blocks get a language label and a Copy link whose
href is ``copy:<index>`` (the view maps it to :func:`code_blocks`). Qt's own Markdown reader
is not used: it treats ``<tag>`` as HTML and drops it, and eats single line breaks.
"""

from __future__ import annotations

import html
from functools import cache

from markdown_it import MarkdownIt

COPY_SCHEME = "copy:"
CODE_STYLE = ("background-color:rgba(127,127,127,0.12); white-space:pre-wrap;"
              " font-family:monospace; margin:0;")


@cache
def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False})
    md.enable(["table", "strikethrough"])
    # "&amp;" stays as written: a model quoting HTML or code means the five characters.
    md.disable("entity")

    def fence(_self, tokens, idx, _options, env) -> str:  # noqa: ANN001
        tok = tokens[idx]
        lang = html.escape(tok.info.strip().split(" ")[0]) if tok.info else ""
        n = env.setdefault("code_index", 0)
        env["code_index"] = n + 1
        head = (f'<p style="margin:6px 0 0 0"><small>{lang or "code"}</small> &nbsp;'
                f'<a href="{COPY_SCHEME}{n}"><small>Copy</small></a></p>')
        # Trailing newline of the block is not content the reader sees.
        body = html.escape(tok.content[:-1] if tok.content.endswith("\n") else tok.content)
        return f'{head}<pre style="{CODE_STYLE}">{body}</pre>\n'

    md.add_render_rule("fence", fence)
    md.add_render_rule("code_block", fence)
    return md


def user_html(text: str) -> str:
    """Plain text as HTML: escaped, line breaks and spaces kept exactly."""
    return f'<div style="white-space:pre-wrap">{html.escape(text, quote=False)}</div>'


def assistant_html(text: str) -> str:
    """Markdown as HTML with raw HTML escaped (shown as text, never interpreted)."""
    return _markdown().render(text, {})


def code_blocks(text: str) -> list[str]:
    """The fenced and indented code blocks of ``text``, in order (what Copy copies)."""
    return [t.content[:-1] if t.content.endswith("\n") else t.content
            for t in _markdown().parse(text) if t.type in ("fence", "code_block")]


def visible_text(text: str) -> list[str]:
    """The pieces of ``text`` a reader sees once Markdown markup is taken away, in order
    (text, inline code, code blocks); the rendered document must contain each of them."""
    out: list[str] = []
    for tok in _markdown().parse(text):
        if tok.type in ("fence", "code_block"):
            out.append(tok.content)
        for child in tok.children or ():
            if child.type in ("text", "code_inline"):
                out.append(child.content)
    return out
