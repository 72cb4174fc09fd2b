#!/usr/bin/env bash
# Build the documentation site and take screenshots of the home page, one guide and one reference page
# with headless Chromium, to look at what the theme renders (navigation, code blocks, tables).
#
#   docs/screenshots.sh [OUT_DIR] [PYTHON]     (default: site-screenshots/ and .venv/bin/python)
#
# Needs mkdocs and its plugins (the test extras) and Chromium: apt-get install chromium (Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-site-screenshots}
python=${2:-.venv/bin/python}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "no Chromium found: apt-get install chromium" >&2
  exit 1
fi
site=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 "$python" -m mkdocs build --strict --quiet --site-dir "$site"
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$python" -m http.server "$port" --bind 127.0.0.1 --directory "$site" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
  "$python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')" 2>/dev/null && break
  sleep 0.1
done
mkdir -p "$out"
shot() {  # shot NAME PATH: a 1400x1800 screenshot of http://127.0.0.1:PORT/PATH
  "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1800 \
    --screenshot="$out/$1.png" "http://127.0.0.1:$port/$2" >/dev/null 2>&1
  echo "$out/$1.png: /$2"
}
shot home ""
shot guide-reading guides/reading/
shot reference-api reference/api/
shot reference-cli reference/cli/
