# Sourced by bin/dev and bin/test: make .venv hold what pyproject.toml asks for.
# Reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
  if ! "$PYTHON" -c 'import ensurepip' >/dev/null 2>&1; then
    # Debian splits venv support out of python3.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    else
      echo "!! $PYTHON cannot create virtual environments: sudo apt-get install python3-venv" >&2
      exit 1
    fi
  fi
  echo "==> creating .venv"
  rm -rf .venv  # a half-made one (no pip) would otherwise stick
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
