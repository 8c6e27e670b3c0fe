"""The Containerfile of a build form, from templates/Containerfile.j2."""

from __future__ import annotations

import shlex

from jinja2 import Environment, PackageLoader, StrictUndefined

from caldera.images.form import BuildForm

_env = Environment(
    loader=PackageLoader("caldera.images", "templates"), undefined=StrictUndefined, trim_blocks=True, autoescape=False
)
_env.filters["shquote"] = shlex.quote


def render(form: BuildForm, base: str, ref: str, pip_cache: bool = False) -> str:
    """``pip_cache``: pip keeps its downloads in /run/caldera-pip, which the build mounts from the host (the ready
    environments' builds only: users' builds never share a cache another user's build wrote)."""
    template = _env.get_template("Containerfile.j2")
    return template.render(form=form, wheels=form.wheels(), base=base, ref=ref, pip_cache=pip_cache)
