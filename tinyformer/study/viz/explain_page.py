"""The explain page as one self-contained HTML document: the template, stylesheet and scripts
shipped beside this module (package data), the data as JSON, and a Content-Security-Policy
that lets only those exact inline scripts and styles run (by their SHA-256) and forbids every
request: the page works offline because it cannot do anything else.

The page's own scripts (``SCRIPTS``) are inlined in that order, each in a <script> element of its
own under its own hash. They share one object, ``window.tinyformerExplain`` (created by the first,
``explain_namespace.js``), and define no other global.

``render`` returns an ``ExplainPage``: the page as a str, which a Jupyter notebook also shows
inline (in a sandboxed iframe) and ``save`` writes to a file.
"""

import base64
import hashlib
import html
import json
import re
from importlib import resources
from pathlib import Path

from ...common.atomic import write_atomically

__all__ = ["ExplainPage", "render", "content_security_policy", "PAGE_FILES", "SCRIPTS"]

# The page's scripts after its data, in the order they run: each takes from the namespace what those
# before it put there (the data, the arrays, the figures, ...); the last draws the page.
SCRIPTS = ("explain_namespace.js", "explain_inflate.js", "explain_arrays.js", "explain_numbers.js",
           "explain_figures.js", "explain_state.js", "explain_panels_heads.js", "explain_panels_gradients.js",
           "explain_slider.js", "explain_selftest.js", "explain_boot.js")
PAGE_FILES = ("explain.html", "explain.css", "explain_guard.js") + SCRIPTS
_SLOTS = ("@CSP@", "@GENERATOR@", "@TITLE@", "@STYLE@", "@GUARD@", "@SOURCE@", "@TARGET@", "@DATA@", "@SCRIPTS@")


def _read(name):
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _sha256(text):
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def content_security_policy(style, scripts):
    """Nothing may load or connect; only ``style`` and ``scripts`` (their exact text) may apply and run."""
    return (f"default-src 'none'; script-src {' '.join(_sha256(s) for s in scripts)}; style-src {_sha256(style)}; "
            "img-src 'none'; connect-src 'none'; font-src 'none'; base-uri 'none'; form-action 'none'")


def _json_for_html(data):
    """JSON that is safe inside <script type="application/json">: no "<" (so no "</script>"), and
    no "http:"/"https:" (a sentence may hold an address; the page must not)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return re.sub(r"(?i)h(?=ttps?:)", lambda m: f"\\u{ord(m.group()):04x}", text)


def _html_text(text):
    """Escaped text for an element's content, with the same care for addresses as the data."""
    return re.sub(r"(?i)(h)(ttps?):", r"\1\2&#58;", html.escape(text, quote=True))


class ExplainPage(str):
    """The page: a str (written, searched and compared as before) that a notebook shows inline.

    Jupyter displays a cell's last value through ``_repr_html_``; the page goes there into an
    iframe's ``srcdoc``, a document of its own, so its Content-Security-Policy, ids and styles do
    not meet the notebook's. The sandbox lets its scripts run and its exports download, and gives
    it no origin: it can read neither the notebook nor its cookies, and still makes no request.
    """

    __slots__ = ()
    HEIGHT = "900px"
    SANDBOX = "allow-scripts allow-downloads"

    def _title(self):
        found = re.search(r"<title>(.*?)</title>", self, re.S)
        return html.unescape(found.group(1)) if found else "tinyformer explain"

    def _repr_html_(self):
        """The page in a sandboxed iframe, for Jupyter (whole: srcdoc holds it, HTML-escaped)."""
        return (f'<iframe title="{html.escape(self._title(), quote=True)}" sandbox="{self.SANDBOX}" '
                f'style="width: 100%; height: {self.HEIGHT}; border: 1px solid #ccc" '
                f'srcdoc="{html.escape(self, quote=True)}"></iframe>')

    def _repr_pretty_(self, printer, cycle):
        """A notebook's text/plain form: one line, not a second copy of the page."""
        printer.text(f"<ExplainPage {self._title()!r}: {len(self.encode('utf-8')) / 2 ** 20:.2f} MiB of HTML>")

    def save(self, path):
        """Write the page to ``path`` as UTF-8 and return it as a Path. The write is atomic (a
        temporary file in the same folder, then a rename): a reader never sees half a page."""
        path = Path(path)
        if not path.parent.is_dir():
            raise FileNotFoundError(f"ExplainPage.save: {path}: the folder {path.parent} does not exist")
        if path.is_dir():
            raise IsADirectoryError(f"ExplainPage.save: {path} is a folder, not a file name")
        write_atomically(path, self.encode("utf-8"))
        return path


def render(data):
    """The page (an ``ExplainPage``, a str) of ``explanation.explain_data``'s dict."""
    template, style, guard, *scripts = (_read(name) for name in PAGE_FILES)
    for name, text in zip(PAGE_FILES[2:], (guard, *scripts)):
        if "</script" in text.lower():
            raise ValueError(f"explain_page: {name} holds '</script', which would end its element early")
    values = {
        "@CSP@": content_security_policy(style, (guard, *scripts)),
        "@GENERATOR@": html.escape(data["generator"]),
        "@TITLE@": _html_text(f"tinyformer explain: {data['source']['text'][:80]}"),
        "@STYLE@": style, "@GUARD@": guard, "@SCRIPTS@": "\n".join(f"<script>{text}</script>" for text in scripts),
        "@SOURCE@": _html_text(data["source"]["text"]), "@TARGET@": _html_text(data["target"]["text"]),
        "@DATA@": _json_for_html(data),
    }
    # One pass over the template: a slot's value is never searched for another slot.
    return ExplainPage(re.sub("|".join(map(re.escape, _SLOTS)), lambda m: values[m.group()], template))
