#!/bin/bash
# The resident memory a bare hyper server pays per open, idle streaming response (a watch that
# has sent its first frame), over HTTP/2 (N streams on one connection) and HTTP/1.1 (N
# connections), with transparent huge pages off as `allot serve` runs. A probe for
# docs/benchmarks.md ("Idle connections and watchers"), not part of the workspace.
# Usage: scripts/probes/h2-watch-memory/run.sh [N]   (default 5000)
set -euo pipefail
cd "$(dirname "$0")"
n=${1:-5000}
cargo build --release --quiet
bin=target/release/h2-watch-memory
for proto in h2 h1; do
    tmp=$(mktemp -d)
    "$bin" server "$proto" > "$tmp/port" 2> "$tmp/rss" &
    server=$!
    while [ ! -s "$tmp/port" ] || [ ! -s "$tmp/rss" ]; do sleep 0.1; done
    before=$(tail -1 "$tmp/rss" | awk '{print $2}')
    "$bin" client "$(cat "$tmp/port")" "$proto" "$n" > "$tmp/client" &
    client=$!
    while ! grep -q open "$tmp/client" 2>/dev/null; do sleep 0.1; done
    sleep 1
    after=$(tail -1 "$tmp/rss" | awk '{print $2}')
    echo "$proto: $n idle watches, $(echo "scale=2; ($after - $before) / $n" | bc) KiB each (server RSS $before -> $after KiB)"
    wait "$client"; kill "$server"; rm -rf "$tmp"
done
