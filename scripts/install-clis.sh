#!/usr/bin/env bash
# Install the real agent CLIs at pinned versions into a cache folder keyed by version,
# reusing what is already there. Prints one line per CLI: NAME PATH-TO-BINARY.
# Never installs globally. Exit status is non-zero if any CLI fails to install.
# npm packages go in a folder named by their spec; PyPI ones (Python >= 3.12 agents) in a
# virtualenv named pypi_NAME_VERSION. Missing ones install in parallel.
#
# Needs Node.js >= 20 (Gemini CLI and Qwen Code require it; Claude Code needs >= 18, Codex
# >= 16) and npm, and for the PyPI agents a Python 3.12 or 3.13 (see find_python). About
# 3.9 GB lands in the cache: the CLIs ship native binaries (Codex 424 MB, Claude Code 235 MB)
# or many dependencies (Aider 666 MB). npm's download cache goes to a temporary folder that is
# removed afterwards (set npm_config_cache to keep one) and pip keeps none, so nothing else is
# left behind.
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
  # More ACP agents, each with a model of one's own (see scripts/fakemodel/acp_agents.py).
  [copilot]="@github/copilot@1.0.102"
  # 7.8.x has no linux-x64 build in the registry; the platform package is named with it.
  [kilo]="@kilocode/cli@7.7.7 @kilocode/cli-linux-x64@7.7.7"
  # pi coding agent: a native adapter (adapters/pi.py; it speaks no ACP itself).
  [pi]="@mariozechner/pi-coding-agent@0.73.1"
)
# PyPI agents: NAME -> "PACKAGE==VERSION BINARY MIN-PYTHON MAX-PYTHON".
declare -A pypkg=(
  [vibe]="mistral-vibe==2.26.1 vibe-acp (3,12,2) (4,)"
  # 1.52.0 is a tombstone that pipes an install script from the internet into bash: keep 1.51.0.
  [kimi]="kimi-cli==1.51.0 kimi (3,12,2) (4,)"
  [aider]="aider-chat==0.86.2 aider (3,10) (3,13)"
  # fast-agent's own ACP launcher package (fast-agent-acp 0.10.48) ships no module: the
  # ``fast-agent acp`` of fast-agent-mcp is the ACP server.
  [fast-agent]="fast-agent-mcp==0.10.48 fast-agent (3,12,2) (3,16)"
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

# A Python for a PyPI agent, in [MIN, MAX) (as Python tuples): python3.12 or python3.13 on
# PATH, or one of pyenv's. Kimi and Vibe need >= 3.12.2 (3.12.1's typing breaks kimi-cli's
# slotted generic dataclasses at import); aider-chat 0.86 needs < 3.13.
find_python() {
  local p root="${PYENV_ROOT:-$HOME/.pyenv}"
  for p in python3.12 "$root"/versions/3.12*/bin/python3 python3.13 "$root"/versions/3.13*/bin/python3; do
    if "$p" -c "import sys; sys.exit(not ($1 <= sys.version_info[:3] < $2))" >/dev/null 2>&1; then
      echo "$p"; return 0
    fi
  done
  return 1
}

status=0
names=(claude codex gemini qwen claude-agent-acp codex-acp opencode copilot kilo pi)
pynames=(vibe kimi aider fast-agent)
pids=()

install_npm() {  # NAME: install into the cache unless there; prints nothing
  local name="$1" specs="${pkg[$1]}"
  local first="${specs%% *}"
  local dir="$cache/${first//[@\/]/_}"
  [ -x "$dir/node_modules/.bin/$name" ] && return 0
  mkdir -p "$dir"
  # shellcheck disable=SC2086  # several specs: one word each
  npm install --silent --no-audit --no-fund --prefix "$dir" $specs >"$dir.log" 2>&1
}

install_pypi() {  # NAME
  local spec bin min max
  read -r spec bin min max <<<"${pypkg[$1]}"
  local dir="$cache/pypi_${spec/==/_}"
  [ -x "$dir/bin/$bin" ] && return 0
  local py
  py="$(find_python "$min" "$max")" || { echo "no Python in [$min, $max) (python3.12, python3.13 or pyenv's) for $spec" >"$dir.log"; return 1; }
  rm -rf "$dir"
  { "$py" -m venv "$dir" && "$dir/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check "$spec"; } >"$dir.log" 2>&1
}

for name in "${names[@]}"; do install_npm "$name" & pids+=($!); done
for name in "${pynames[@]}"; do install_pypi "$name" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid" || true; done

for name in "${names[@]}"; do
  specs="${pkg[$name]}"
  first="${specs%% *}"
  dir="$cache/${first//[@\/]/_}"
  bin="$dir/node_modules/.bin/$name"
  if [ ! -x "$bin" ]; then
    echo "install-clis: $specs failed to install (npm said, in $dir.log):" >&2
    tail -n 15 "$dir.log" | sed 's/^/  /' >&2
    status=1
    continue
  fi
  echo "$name $bin"
done
for name in "${pynames[@]}"; do
  read -r spec binary _ <<<"${pypkg[$name]}"
  dir="$cache/pypi_${spec/==/_}"
  bin="$dir/bin/$binary"
  if [ ! -x "$bin" ]; then
    echo "install-clis: $spec failed to install (pip said, in $dir.log):" >&2
    grep -v "^WARNING: Location" "$dir.log" | tail -n 15 | sed 's/^/  /' >&2
    status=1
    continue
  fi
  echo "$name $bin"
done
exit $status
