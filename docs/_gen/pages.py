"""mkdocs-gen-files script: writes the generated reference pages (see refs.py)."""

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import mkdocs_gen_files  # noqa: E402
import refs  # noqa: E402

with mkdocs_gen_files.open("reference/config.md", "w") as f:
    f.write(refs.config_page())
with mkdocs_gen_files.open("reference/presets.md", "w") as f:
    f.write(refs.presets_page())
with mkdocs_gen_files.open("reference/cli.md", "w") as f:
    f.write(refs.cli_page())
with mkdocs_gen_files.open("reference/protocol.md", "w") as f:
    f.write(refs.protocol_page())
with tempfile.TemporaryDirectory() as tmp:
    with mkdocs_gen_files.open("reference/report.md", "w") as f:
        f.write(refs.report_page(refs.sample_reports(tmp)))

# The API: one page per module, found by walking the packages; the nav is written with them.
nav = ["* [API](api/index.md)"]
index = [
    "# API",
    "",
    "Generated from the docstrings of every public module "
    "(mkdocstrings), by walking the packages at build time.",
    "",
]
for mod in refs.modules():
    page = "api/" + mod.replace(".", "/") + ".md"
    with mkdocs_gen_files.open("reference/" + page, "w") as f:
        f.write(f"# `{mod}`\n\n::: {mod}\n")
    depth = mod.count(".")
    nav.append("    " * (depth + 1) + f"* [{mod.rsplit('.', 1)[-1]}]({page})")
    index.append("    " * depth + f"- [`{mod}`]({mod.replace('.', '/')}.md)")
with mkdocs_gen_files.open("reference/api/index.md", "w") as f:
    f.write("\n".join(index) + "\n")
with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as f:
    f.write(
        "* [Run-config keys](config.md)\n* [Presets](presets.md)\n"
        "* [Report fields](report.md)\n* [The fedgraph command](cli.md)\n"
        "* [Messages between server and clients](protocol.md)\n" + "\n".join(nav) + "\n"
    )
