#!/usr/bin/env bash
# Install the real agent CLIs at pinned versions into a cache folder keyed by version,
# reusing what is already there. Prints one line per CLI: NAME PATH-TO-BINARY.
# Never installs globally. Exit status is non-zero if any CLI fails to install.
#
# Needs Node.js >= 20 (Gemini CLI and Qwen Code require it; Claude Code needs >= 18, Codex
# >= 16) and npm. About 1.5 GB lands in the cache, seven packages: the CLIs ship native
# binaries (Codex 424 MB, opencode 354 MB, Claude Code 235 MB, codex-acp 223 MB). npm's
# download cache goes to a temporary folder that is removed afterwards (set npm_config_cache
# to keep one), so nothing else is left behind.
set -euo pipefail
NODE_MAJOR_NEEDED=20
cache="${CORRAL_CLI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corral/clis}"
declare -A pkg=(
  [claude]="@anthropic-ai/claude-code@2.1.197"
  [codex]="@openai/codex@0.171.0"
  [gemini]="@google/gemini-cli@0.61.0"
  [qwen]="@qwen-code/qwen-code@0.15.10"
  # ACP agents and bridges (gemini and qwen speak ACP themselves, with --acp)
  [claude-agent-acp]="@zed-industries/claude-agent-acp@0.23.1"
  [codex-acp]="@zed-industries/codex-acp@0.16.0"
  [opencode]="opencode-ai@1.18.33"
)

missing() {
  echo "install-clis: $1" >&2
  echo "install-clis: the real-CLI tests need Node.js >= $NODE_MAJOR_NEEDED and npm: install them" \
       "(https://nodejs.org/en/download, or your distribution's nodejs and npm packages if new enough)." >&2
  echo "install-clis: or run 'make test-core': every test that needs no agent CLI." >&2
  exit 1
}

# Check before downloading anything; builtins only, so this works on a bare PATH too.
command -v node >/dev/null 2>&1 || missing "Node.js (node) is not installed or not on PATH."
command -v npm >/dev/null 2>&1 || missing "npm is not installed or not on PATH."
node_version="$(node --version 2>/dev/null || true)"
node_major="${node_version#v}"
node_major="${node_major%%.*}"
if ! [[ "$node_major" =~ ^[0-9]+$ ]] || (( node_major < NODE_MAJOR_NEEDED )); then
  missing "Node.js ${node_version:-of unknown version} is too old."
fi

if [ -z "${npm_config_cache:-}" ]; then
  npm_config_cache="$(mktemp -d "${TMPDIR:-/tmp}/corral-npm-cache.XXXXXX")"
  export npm_config_cache
  trap 'rm -rf "$npm_config_cache"' EXIT
fi

status=0
for name in claude codex gemini qwen claude-agent-acp codex-acp opencode; do
  spec="${pkg[$name]}"
  dir="$cache/${spec//[@\/]/_}"
  bin="$dir/node_modules/.bin/$name"
  if [ ! -x "$bin" ]; then
    mkdir -p "$dir"
    if ! npm install --silent --no-audit --no-fund --prefix "$dir" "$spec" >"$dir.log" 2>&1; then
      echo "install-clis: $spec failed to install (npm said, in $dir.log):" >&2
      tail -n 15 "$dir.log" | sed 's/^/  /' >&2
      status=1
      continue
    fi
  fi
  echo "$name $bin"
done
exit $status
