# Sourced by bin/dev and bin/test: make .venv hold what pyproject.toml asks for.
# Reinstalls only when pyproject.toml (or constraints.txt) changed since the last
# install. VENV names the environment (bin/test-newest builds .venv-newest the
# same way); CONSTRAINTS=none installs the newest releases pyproject.toml allows
# instead of the versions pinned in constraints.txt.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
if ! "$VENV"/bin/python -m pip --version >/dev/null 2>&1; then
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
  echo "==> creating $VENV"
  rm -rf "$VENV"  # a half-made one (no pip) would otherwise stick
  "$PYTHON" -m venv "$VENV"
fi
CONSTRAINTS=${CONSTRAINTS:-constraints.txt}
constraint_args=()
[ "$CONSTRAINTS" = none ] || constraint_args=(-c "$CONSTRAINTS")
stamp="$VENV/.installed-$(cat pyproject.toml "${constraint_args[@]:1}" | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "==> installing dependencies into $VENV (pyproject.toml or ${CONSTRAINTS} changed)"
  "$VENV"/bin/python -m pip install --quiet --upgrade pip
  "$VENV"/bin/python -m pip install --quiet "${constraint_args[@]}" -e ".[project,local,test,dev]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
