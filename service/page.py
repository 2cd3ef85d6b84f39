"""The page at /: one self-contained HTML file (every service/static/*.css and *.js inlined, no CDN, no other
request) that carries the current /routing document, so its first paint already shows the data.

``page_html`` is pure (files' texts and a document in, HTML out). The cards the first paint shows are also
written here as HTML, so a browser that runs no script, or a screenshot taken before any script, shows
figures; app.js then redraws everything from the embedded document and polls /routing.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

SCRIPT_LAST = "app.js"  # the page's own script runs after every other one (experiments.js defines what it calls)


def _fmt_int(n: float) -> str:
    """As app.js's fmtInt: 1.2G, 3.4M, 56.7k, or the integer."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}G"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e4:
        return f"{n / 1e3:.1f}k"
    return str(int(n))


def cards_html(doc: dict[str, Any] | None) -> str:
    """The headline cards, as app.js draws them (same ids and classes), from a /routing document."""
    if not doc:
        return ""
    calls = sum(r.get("calls", 0) for r in doc.get("counts", []))
    dip = (doc.get("decode_in_prefill") or {}).get("calls", 0)
    decode = sum(r.get("calls", 0) for r in doc.get("decode_path", []))
    health = doc.get("health") or {}
    errors = sum((health.get("telemetry_errors") or {}).values()) + sum(r.get("calls", 0) for r in doc.get("errors", []))
    last = health.get("last_flush_ts")
    flushed = f"{max(0.0, doc['service']['ts'] - last):.1f} s ago" if last else "–"
    cards = [("prefill-entry calls", _fmt_int(calls), False, "card-calls"),
             ("decode-in-prefill calls", _fmt_int(dip), dip > 0, "card-dip"),
             ("decode-entry calls", _fmt_int(decode), False, "card-decode"),
             ("kernel + telemetry errors", _fmt_int(errors), errors > 0, "card-errors"),
             ("last flush", flushed, False, "card-flush")]
    return "".join(f'<div class="card{" bad" if bad else ""}" id="{i}"><div class="v">{html.escape(v)}</div>'
                   f'<div class="k">{html.escape(k)}</div></div>' for k, v, bad, i in cards)


def _script(text: str) -> str:
    return text.replace("</script", "<\\/script")  # a literal in a script must not close the element


def page_html(template: str, styles: list[tuple[str, str]], scripts: list[tuple[str, str]],
              doc_json: bytes | None, doc: dict[str, Any] | None) -> str:
    """The template with ``<!--routescope:NAME-->`` markers replaced: style, cards, initial (the document), scripts."""
    style = "\n".join(f"/* {name} */\n{text}" for name, text in styles)
    ordered = sorted(scripts, key=lambda s: (s[0] == SCRIPT_LAST, s[0]))
    js = "\n".join(f"<script>/* {name} */\n{_script(text)}\n</script>" for name, text in ordered)
    # JSON inside <script type="application/json">: escaping "<" keeps "</script>" in a string from closing it
    initial = (doc_json or b"null").decode("utf-8").replace("<", "\\u003c")
    parts = {"style": f"<style>\n{style}\n</style>", "cards": cards_html(doc), "scripts": js,
             "initial": f'<script type="application/json" id="routing-initial">{initial}</script>'}
    out = template
    for name, value in parts.items():
        marker = f"<!--routescope:{name}-->"
        if marker not in out:
            raise ValueError(f"index.html has no {marker}")
        out = out.replace(marker, value)
    return out


def static_files(folder: Path) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
    """(index.html, [(name, css)], [(name, js)]) from the page's folder."""
    read = lambda p: p.read_text(encoding="utf-8")  # noqa: E731
    return (read(folder / "index.html"), [(p.name, read(p)) for p in sorted(folder.glob("*.css"))],
            [(p.name, read(p)) for p in sorted(folder.glob("*.js"))])


def page_for(folder: Path, doc_json: bytes | None) -> str:
    """The page with this /routing document in it (None: the page fetches it)."""
    template, styles, scripts = static_files(folder)
    doc = json.loads(doc_json) if doc_json else None
    return page_html(template, styles, scripts, doc_json, doc)
