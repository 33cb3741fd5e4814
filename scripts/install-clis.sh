#!/usr/bin/env bash
# Install the real agent CLIs at pinned versions into a cache folder keyed by version,
# reusing what is already there. Prints one line per CLI: NAME PATH-TO-BINARY.
# Never installs globally. Exit status is non-zero if any CLI fails to install.
set -euo pipefail
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
status=0
for name in claude codex gemini qwen claude-agent-acp codex-acp opencode; do
  spec="${pkg[$name]}"
  dir="$cache/${spec//[@\/]/_}"
  bin="$dir/node_modules/.bin/$name"
  if [ ! -x "$bin" ]; then
    mkdir -p "$dir"
    if ! npm install --silent --no-audit --no-fund --prefix "$dir" "$spec" >"$dir.log" 2>&1; then
      echo "install-clis: $spec failed to install; see $dir.log" >&2
      status=1
      continue
    fi
  fi
  echo "$name $bin"
done
exit $status
