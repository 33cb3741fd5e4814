#!/bin/sh
# The web dashboard: the daemon serves it on a loopback TCP listener that a token guards.
set -e
port=${PORT:-8765}
(umask 077; openssl rand -hex 32 > corral.token)   # the CLI's secret; it never reaches the browser
cat > dashboard.toml <<TOML
[server]
socket = "dashboard.sock"
tcp = "127.0.0.1:$port"
token_file = "corral.token"

[store]
path = "dashboard.db"

[agents.demo]
adapter = "demo"
TOML
corral run -c dashboard.toml &
until corral -c dashboard.toml status >/dev/null 2>&1; do sleep 0.1; done

corral -c dashboard.toml send general "Hello! Who are you?"
corral -c dashboard.toml dashboard    # a login URL that works once, for 2 minutes (--open opens it)
echo "the dashboard is served until you press Enter"
read -r _ || true                     # (end of input, too)
corral -c dashboard.toml shutdown
wait
