"""MkDocs hook: griffe's complaints about the *layout* of a docstring (a line of an ``Args:``
section it cannot split into ``name: description``) are shown as INFO lines, not warnings, so
that ``mkdocs build --strict`` fails on what breaks the site (a missing page, a broken link or
anchor, an unresolvable ``:::`` reference) and not on docstring formatting of code owned
elsewhere. Everything else griffe says stays a warning."""

import logging
import re

_LAYOUT = (
    "Failed to get 'name: description' pair",
    "Failed to get 'exception: description' pair",
    "Empty ",
    "No type or annotation for",
    "does not appear in the function signature",
    "Confusing indentation",
    "Failed to parse field directive",
)


class _Layout(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and any(s in record.getMessage() for s in _LAYOUT):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def on_startup(command, dirty):
    for name in ("griffe", "mkdocs.plugins.griffe", "mkdocs.plugins.mkdocstrings_handlers.python"):
        logging.getLogger(name).addFilter(_Layout())


_ROLE = re.compile(r":(?:py:)?(?:mod|meth|func|class|data|attr|exc|obj):(?=<code>)")


def on_page_content(html, page, config, files):
    """The code's docstrings use Sphinx roles (``:func:`name```); in the API pages they are
    shown as the plain code name."""
    return _ROLE.sub("", html)
