"""The report page: one self-contained HTML file (no network, no server) for a plan and/or a validate run.

    html = page(plan=plan_page(job, gpus, search_result), validate=validate_page(validate_json))
    write(path, html)

The page is a Jinja2 template (page.html.j2) with its stylesheet (page.css), its script (page.js) and
Chart.js (vendor/, MIT) inlined, and the data as one JSON block; data.py builds that data.
"""

from __future__ import annotations

import datetime
import json
from importlib import resources
from pathlib import Path

from shardwise.report.data import plan_page, validate_page

CHARTJS_VERSION = "4.6.1"


def _asset(name: str) -> str:
    return resources.files("shardwise.report").joinpath(name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """Text that cannot end the <script> element it is inlined into."""
    if "</script" in text.lower():
        raise ValueError("inlined script contains '</script'")
    return text


def page(plan: dict | None = None, validate: dict | None = None) -> str:
    """The whole HTML document."""
    import jinja2
    from markupsafe import Markup

    from shardwise import __version__

    if plan is not None:
        title = f"{plan['model']} on {plan['gpus']:,} × {plan['cluster']}: where to split"
        subtitle = (f"global batch {plan['global_batch']:,} × {plan['seq_len']:,} tokens; {plan['fit']:,} of "
                    f"{plan['scored']:,} scored layouts fit in {plan['gpu_memory_gib']:g} GiB per GPU"
                    + (f" and {plan['emitted']['title']} can run" if plan.get("emitted") else ""))
    else:
        title = f"{validate['model']}: predicted vs measured"
        subtitle = f"{len(validate['layouts'])} layouts trained on {validate['world']} ranks ({validate['backend']})"
    data = json.dumps({"plan": plan, "validate": validate}, separators=(",", ":"), allow_nan=False)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template = env.from_string(_asset("page.html.j2"))
    return template.render(
        title=title, subtitle=subtitle, plan=plan, validate=validate, version=__version__,
        written=datetime.date.today().isoformat(), chartjs_version=CHARTJS_VERSION,
        css=Markup(_asset("page.css")),
        data_json=Markup(data.replace("<", "\\u003c")),  # JSON stays valid; no "</script>" can appear
        chartjs=Markup(_script_safe(_asset("vendor/chart.umd.min.js"))),
        chartjs_license=Markup(_asset("vendor/chart.js.LICENSE.md").replace("*/", "* /")),
        page_js=Markup(_script_safe(_asset("page.js"))),
    )


def write(path: str | Path, html: str) -> Path:
    path = Path(path)
    path.write_text(html, encoding="utf-8")
    return path


__all__ = ["page", "plan_page", "validate_page", "write"]
