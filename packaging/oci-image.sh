#!/usr/bin/env bash
# Builds the OCI image of rate_limit that CloudNativePG mounts as an image volume (PostgreSQL 18 and its
# extension_control_path), with Debian's umoci and no registry and no container engine:
#   packaging/oci-image.sh OUT_DIR                               a release build for the tests' PostgreSQL 18
#   packaging/oci-image.sh --from-installation PREFIX OUT_DIR    the files installed under PREFIX (the tests)
# The image holds nothing but the extension, in the layout CloudNativePG expects of an image volume
# (docs/packaging.md): lib/rate_limit.so, and share/extension/rate_limit.control with the install and
# upgrade scripts. It writes OUT_DIR/oci, an OCI image layout tagged VERSION-pg18, and
# OUT_DIR/rate_limit-VERSION-pg18.oci.tar, the same as an archive, which skopeo pushes to a registry:
#   skopeo copy oci-archive:OUT_DIR/rate_limit-0.5.0-pg18.oci.tar docker://REGISTRY/rate_limit:0.5.0-pg18
# The library must match the cluster's PostgreSQL major version, operating system and architecture: this
# one is built on Debian 12 for PostgreSQL 18 (CloudNativePG's bookworm images).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=../scripts/cluster.sh
source scripts/cluster.sh
prefix=""
if [ "${1:-}" = --from-installation ]; then
  prefix=$2
  shift 2
fi
out=${1:?usage: packaging/oci-image.sh [--from-installation PREFIX] OUT_DIR}
v=18
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
tag="$version-pg$v"
mkdir -p "$out"
out=$(cd "$out" && pwd)

# the files: from an installation, or a release build
if [ -n "$prefix" ]; then
  lib=$("$prefix/bin/pg_config" --pkglibdir)
  ext="$("$prefix/bin/pg_config" --sharedir)/extension"
else
  pg_config="$(pg_bindir "$v")/pg_config"
  cargo pgrx package --pg-config "$pg_config" --features "pg$v" --no-default-features --out-dir "$out/build" \
    >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  lib="$out/build$("$pg_config" --pkglibdir)"
  ext="$out/build$("$pg_config" --sharedir)/extension"
fi
[ -f "$lib/rate_limit.so" ] && [ -f "$ext/rate_limit.control" ] || { echo "no rate_limit in $lib, $ext" >&2; exit 1; }

# the image: one layer with lib/ and share/extension/
layout="$out/oci"
bundle="$out/bundle"
rm -rf "$layout" "$bundle"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --rootless --image "$layout:$tag" "$bundle" >/dev/null
mkdir -p "$bundle/rootfs/lib" "$bundle/rootfs/share/extension"
install -m 0755 "$lib/rate_limit.so" "$bundle/rootfs/lib/"
install -m 0644 "$ext"/rate_limit.control "$ext"/rate_limit--*.sql "$bundle/rootfs/share/extension/"
umoci repack --image "$layout:$tag" "$bundle"
umoci config --image "$layout:$tag" \
  --config.label "org.opencontainers.image.title=rate_limit" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.description=rate_limit $version for PostgreSQL $v: lib/ and share/extension/ for a CloudNativePG image volume" \
  --config.label "org.opencontainers.image.licenses=PostgreSQL"
umoci gc --layout "$layout"
rm -rf "$bundle"
tar -C "$layout" -cf "$out/rate_limit-$tag.oci.tar" .
echo "$layout:$tag and $out/rate_limit-$tag.oci.tar"
