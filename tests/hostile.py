"""A corpus of hostile and odd inputs, shared by the library and page tests.

Each entry: (name, text, expected) where expected is "error" (a clear InputError), or a dict of
properties the result must have.
"""

from __future__ import annotations

import re

#: the colours Streamlit's plotly element replaces anywhere in a figure's spec ("#000001"..),
#: user text included: no figure may carry this text
PLACEHOLDER = re.compile(r"#0000[0-4][0-9]")

LONG = ("All work and no play makes Jack a dull boy. " * 2300)[:100_000]

CASES: list[tuple[str, str, object]] = [
    ("empty", "", "error"),
    ("whitespace", " \t\n  \u3000 ", "error"),
    ("one character", "a", {"tokens": ["[CLS]", "a", "[SEP]"]}),
    ("100k characters", LONG, {"truncated": True}),
    (
        "emoji zwj and skin tone",
        "Family 👩‍👩‍👧‍👦 likes 👍🏽 a lot",
        {"contains": ["[UNK]", "family"]},
    ),
    ("cjk", "我爱自然语言处理", {"contains": ["我"]}),
    ("rtl arabic hebrew", "مرحبا بالعالم and שלום", {"contains": ["and"]}),
    ("combining marks", "Cafe\u0301 na\u0308ive", {"contains": ["cafe"]}),
    ("control and nul", "tab\there\x00nul\x07bell", {"min_tokens": 3}),
    ("special tokens typed", "[CLS] [SEP] <|endoftext|> [MASK]", {"special_count": 2}),
    (
        "html and script",
        "<script>alert(1)</script> <img src=x onerror=alert(2)> <b>bold</b>",
        {"contains": ["<", "script", ">"]},
    ),
    ("markdown and latex", "**x** _y_ $x^2$ `code` # title", {"contains": ["*", "$"]}),
    ("only punctuation", "?!... ,;:", {"all_punct": True}),
    ("unknown only", "👍👍 🐱", {"contains": ["[UNK]"]}),
]


def rendered(body: str) -> tuple[str, str]:
    """What a markdown body shows: ``(visible text, html)``, rendered by a CommonMark parser with
    HTML enabled, as Streamlit's markdown renders messages and captions."""
    import html
    import re

    from markdown_it import MarkdownIt

    page = MarkdownIt("commonmark", {"html": True}).render(body)
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    return text.replace("\u2060", ""), page  # word joiners are invisible


def markup_tags(body: str) -> list[str]:
    """The tags a markdown body renders to besides plain paragraphs and line breaks: links,
    images, emphasis, headings, raw HTML... Empty for text shown literally."""
    import html
    import re

    _, page = rendered(body)
    text = html.unescape(re.sub(r"<[^>]+>", "", page))  # with its word joiners
    tags = [t for t in re.findall(r"<\s*(/?\w+)", page) if t.strip("/") not in ("p", "br")]
    # GitHub-flavoured markdown (Streamlit's) also links bare URLs, www. names and e-mail
    # addresses found in the text after escapes are resolved
    if re.search(r"https?://|www\.|[\w.+-]@[\w-]+\.\w", text, re.IGNORECASE):
        tags.append("a")
    return tags


def notice_lines(at) -> list[str]:
    """Every notice a page ran shows, one a line: the lines of its warnings (notices share one
    box, ``ui.state.show_notices``) and of the markdown in its expanders (where more than three
    are listed)."""
    lines = [line.strip() for w in at.warning for line in rendered(w.value)[0].splitlines()]
    for expander in at.expander:
        for block in expander.markdown:
            lines += [line.strip() for line in rendered(block.value)[0].splitlines()]
    return [line for line in lines if line]
