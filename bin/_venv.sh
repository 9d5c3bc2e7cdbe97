# Sourced by bin/dev and bin/test: make .venv hold what pyproject.toml asks for.
# Reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "==> installing dependencies into .venv (pyproject.toml changed)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[local,test,dev]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
