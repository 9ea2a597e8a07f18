"""A griffe extension for the docs site: duotf's docstrings name other objects with Sphinx
roles (``:class:`Cluster```, ``:meth:`~duotf.Cluster.train```), which Markdown would show as
raw text. Once the package is loaded, each role becomes a link to the object it names,
resolved in the scope of the docstring's object as Python would, shown in code; a name the
site does not document stays plain code (an optional cross-reference: no broken link).
mkdocs.yml loads it for mkdocstrings (``extensions``)."""

from __future__ import annotations

import html
import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`<>]+)`")


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as named in ``obj``'s docstring: itself where it is already
    a path of the package, else its first part resolved in ``obj``'s scope."""
    target = target.lstrip(".")
    if target.split(".")[0] == obj.package.name:
        return target
    head, _, rest = target.partition(".")
    try:
        found = obj.resolve(head)
    except Exception:  # griffe's NameResolutionError: not a name of that scope
        return target
    return f"{found}.{rest}" if rest else found


def _rewrite(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        def link(match: re.Match) -> str:
            tilde, target = match.groups()
            shown = target.rsplit(".", 1)[-1] if tilde else target
            full = html.escape(_resolve(obj, target), quote=True)
            return f'<autoref identifier="{full}" optional><code>{html.escape(shown)}</code></autoref>'

        obj.docstring.value = ROLE.sub(link, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _rewrite(member)


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        _rewrite(pkg)
