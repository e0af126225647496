#!/usr/bin/env bash
# CI for the editor clients: the VS Code extension (build, unit tests, .vsix) and the Neovim plugin's
# end-to-end test against the real server. Exits non-zero on the first failure.
#
#   clients/ci.sh            everything
#   clients/ci.sh vscode     only the extension
#   clients/ci.sh nvim       only the Neovim test
#   clients/ci.sh trace      only the canvas view (dfim trace) rendered by headless Chromium
#   clients/ci.sh install    the extension, then its .vsix installed into code-server (VS Code 1.139 from
#                            npm), inline ghost text, cycling, Tab-Tab and the canvas webview driven there;
#                            not part of `all`: the first run sets code-server up (cached in
#                            .cache/code-server; how long it takes: docs/editors.md)
#                            (clients/vscode/scripts/install-check.sh)
#
# Needs Node >= 20 with npm, and (for the Neovim test) the repo's .venv from ./install.sh --test.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
what=${1:-all}

step() { printf '\n== %s\n' "$*"; }

# pytest_no_skips FILE WHAT: run a test file that needs WHAT; -rs shows skip reasons, and a skip here
# means WHAT vanished after being installed, so it fails.
pytest_no_skips() {
  local out
  out=$("${PYTHON:-$ROOT/.venv/bin/python}" -m pytest -q -rs "$1" 2>&1) || { echo "$out"; exit 1; }
  echo "$out"
  if grep -q ' skipped' <<<"$out"; then
    echo "clients/ci.sh: a $2 test was skipped" >&2
    exit 1
  fi
}

# apt_install PACKAGE WHAT: install a Debian package when running as root with apt-get, else fail.
apt_install() {
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    step "apt-get install $1"
    apt-get install -y "$1" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y "$1" >/dev/null; }
  else
    echo "clients/ci.sh: $2 is missing and this is not root with apt-get; install it" >&2
    exit 1
  fi
}

if [[ $what == all || $what == vscode || $what == install ]]; then
  command -v npm >/dev/null || { echo "clients/ci.sh: npm is missing (Node >= 20 needed)" >&2; exit 1; }
  cd "$ROOT/clients/vscode"
  step "vscode: npm ci"
  npm ci --no-fund --no-audit
  step "vscode: compile"
  npm run compile
  step "vscode: unit tests"
  npm test
  step "vscode: package"
  rm -f dfim.vsix
  npm run package
  test -s dfim.vsix
  # into a variable: `... | grep -q` dies of SIGPIPE under pipefail; python's zipfile needs no unzip
  listing=$("${PYTHON:-$ROOT/.venv/bin/python}" -m zipfile -l dfim.vsix 2>/dev/null || python3 -m zipfile -l dfim.vsix)
  grep -q 'extension/out/extension.js' <<<"$listing"
  grep -q 'extension/node_modules/vscode-languageclient/package.json' <<<"$listing"
  if grep -qE 'extension/(out/test|scripts)/' <<<"$listing"; then
    echo "clients/ci.sh: the .vsix carries the tests or the check scripts" >&2
    exit 1
  fi
  cd "$ROOT"
fi

if [[ $what == all || $what == nvim ]]; then
  command -v nvim >/dev/null || apt_install neovim "nvim (Neovim >= 0.7)"
  nvim --version | head -1
  step "nvim: end-to-end test against the real server"
  pytest_no_skips tests/clients/test_nvim_client.py Neovim
fi
if [[ $what == all || $what == trace ]]; then
  [[ -x /usr/bin/chromium ]] || apt_install chromium /usr/bin/chromium
  step "trace: the canvas view in headless Chromium"
  pytest_no_skips tests/engine/inference/test_trace.py Chromium
fi
if [[ $what == install ]]; then
  [[ -x /usr/bin/chromium ]] || apt_install chromium /usr/bin/chromium
  step "vscode: the .vsix in code-server, and the canvas webview"
  clients/vscode/scripts/install-check.sh --webview
fi
echo "clients/ci.sh: ok"
