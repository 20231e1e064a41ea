#!/bin/sh
# Fetch the vendored xterm.js (MIT) from npm: the built files as the package ships them,
# checked against the registry's integrity hash by npm. Run from anywhere; commit the result.
# The version is pinned here and noted in VERSIONS.
set -eu
VERSION=6.0.0
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "@xterm/xterm@$VERSION" >/dev/null)
tar -xzf "$work/xterm-xterm-$VERSION.tgz" -C "$work"
cp "$work/package/lib/xterm.js" "$here/xterm.js"
cp "$work/package/css/xterm.css" "$here/xterm.css"
cp "$work/package/LICENSE" "$here/xterm.LICENSE"
printf '@xterm/xterm %s (MIT), from https://registry.npmjs.org/@xterm/xterm/-/xterm-%s.tgz by fetch-xterm.sh\n' \
    "$VERSION" "$VERSION" > "$here/VERSIONS"
