#!/usr/bin/env bash
# The documentation site: set up .venv if needed (scripts/setup.sh), add the `docs` extra if
# mkdocs is missing, then `mkdocs build --strict` into site/ (offline; every warning, e.g. a
# broken link or API reference, fails). Extra args go to mkdocs build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! .venv/bin/python -c "import mkdocs, material, mkdocstrings_handlers.python, mkdocs_gen_files, mkdocs_literate_nav" 2>/dev/null; then
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[docs]"
fi
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 OMP_NUM_THREADS=1
export NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true PYTHONWARNINGS=ignore
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
# mkdocstrings reads the packages as installed (strategies/ and simulations/ inside fedgraph/,
# pyproject's package-dir): build/docs-src/fedgraph links each entry of the three folders.
rm -rf build/docs-src && mkdir -p build/docs-src/fedgraph
for entry in fedgraph/* strategies simulations; do
  ln -s "$PWD/$entry" "build/docs-src/fedgraph/$(basename "$entry")"
done
.venv/bin/python -m mkdocs build --strict "$@"
echo "docs: built site/ in $(( $(date +%s) - start )) s"
