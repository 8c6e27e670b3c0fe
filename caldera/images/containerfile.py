"""The Containerfile of a build form, from templates/Containerfile.j2."""

from __future__ import annotations

import shlex

from jinja2 import Environment, PackageLoader, StrictUndefined

from caldera.images.form import BuildForm

_env = Environment(
    loader=PackageLoader("caldera.images", "templates"), undefined=StrictUndefined, trim_blocks=True, autoescape=False
)
_env.filters["shquote"] = shlex.quote


def render(form: BuildForm, base: str, ref: str) -> str:
    return _env.get_template("Containerfile.j2").render(
        form=form, apt=form.debian_packages(), wheels=form.wheels(), vscode=form.vscode_downloads(), base=base, ref=ref
    )
