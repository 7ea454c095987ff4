#!/usr/bin/env bash
# Build criguard's Debian package with dpkg-deb from a staging directory:
# the binary (/usr/bin/criguard, debug info stripped), the systemd units
# (/lib/systemd/system), /etc/criguard/config.toml and /etc/default/criguard
# as conffiles, the docs, deploy/rbac.yaml, the alert rules and the
# dashboard under /usr/share/doc/criguard, man pages and shell completions
# generated from the binary itself (`criguard generate`), and the
# maintainer scripts of packaging/deb/.
#
# Usage: hack/deb.sh [OUTDIR]            (default: target/deb)
# Environment:
#   CRIGUARD_BIN          package this binary instead of building a release one
#   CRIGUARD_DEB_VERSION  the package version [default: Cargo's version, -1]
#   CRIGUARD_DEB_COMPRESS dpkg-deb compression: xz (default), gzip, none
# Prints the path of the .deb on its last line.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-target/deb}"
version="${CRIGUARD_DEB_VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)-1}"
compress="${CRIGUARD_DEB_COMPRESS:-xz}"
arch="$(dpkg --print-architecture)"

if [[ -z "${CRIGUARD_BIN:-}" ]]; then
    command -v protoc >/dev/null || [[ -n "${PROTOC:-}" ]] ||
        { echo "deb.sh: protoc is needed to build: run hack/install-deps.sh (protobuf-compiler)" >&2; exit 1; }
    cargo build --release --bin criguard
    CRIGUARD_BIN=target/release/criguard
fi

stage="$(mktemp -d "${TMPDIR:-/tmp}/criguard-deb.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
root="$stage/criguard_${version}_${arch}"
doc="$root/usr/share/doc/criguard"

# The binary, without its debug info (the release profile keeps line
# tables); as it is where binutils is missing (the VM tier's guest).
install -d "$root/usr/bin"
if command -v objcopy >/dev/null; then
    objcopy --strip-debug "$CRIGUARD_BIN" "$root/usr/bin/criguard"
else
    cp "$CRIGUARD_BIN" "$root/usr/bin/criguard"
fi
chmod 0755 "$root/usr/bin/criguard"

# The units, with the packaged paths (hack/install.sh's are under /usr/local).
install -d "$root/lib/systemd/system"
for unit in criguard.service criguard.socket; do
    sed -e 's|/usr/local/bin/criguard|/usr/bin/criguard|g' \
        -e 's|file:///usr/local/share/doc/criguard/README.md|file:///usr/share/doc/criguard/README.md man:criguard-serve(1)|' \
        -e 's|/usr/local/share/doc/criguard|/usr/share/doc/criguard|g' \
        "systemd/$unit" >"$root/lib/systemd/system/$unit"
    chmod 0644 "$root/lib/systemd/system/$unit"
done

# Configuration: conffiles, kept across upgrades when changed.
sed 's|/usr/local/share/doc/criguard|/usr/share/doc/criguard|g' etc/config.toml |
    install -D -m 0644 /dev/stdin "$root/etc/criguard/config.toml"
install -D -m 0644 packaging/deb/default "$root/etc/default/criguard"
"$CRIGUARD_BIN" check-config --config "$root/etc/criguard/config.toml" >/dev/null

# Documentation.
install -D -m 0644 README.md "$doc/README.md"
for d in docs/*.md; do
    install -D -m 0644 "$d" "$doc/$(basename "$d")"
done
install -D -m 0644 deploy/rbac.yaml "$doc/rbac.yaml"
install -D -m 0644 proto/criguard/admin/v1/admin.proto "$doc/admin.proto"
install -D -m 0644 deploy/prometheus/criguard-alerts.yaml "$doc/prometheus/criguard-alerts.yaml"
install -D -m 0644 deploy/grafana/criguard-dashboard.json "$doc/grafana/criguard-dashboard.json"
install -D -m 0644 packaging/deb/copyright "$doc/copyright"
printf 'criguard (%s) unstable; urgency=medium\n\n  * Built from %s.\n\n -- criguard maintainers <criguard@localhost>  %s\n' \
    "$version" "$(git rev-parse --short HEAD 2>/dev/null || echo 'a source tree')" "$(date -R)" |
    gzip -9n >"$doc/changelog.Debian.gz"

# Man pages and completions, from the CLI definition of this very binary.
gen="$stage/gen"
"$CRIGUARD_BIN" generate man "$gen/man" >/dev/null
"$CRIGUARD_BIN" generate completions "$gen/completions" >/dev/null
install -d "$root/usr/share/man/man1"
for page in "$gen"/man/*.1; do
    gzip -9n <"$page" >"$root/usr/share/man/man1/$(basename "$page").gz"
done
install -D -m 0644 "$gen/completions/criguard.bash" "$root/usr/share/bash-completion/completions/criguard"
install -D -m 0644 "$gen/completions/_criguard" "$root/usr/share/zsh/vendor-completions/_criguard"
install -D -m 0644 "$gen/completions/criguard.fish" "$root/usr/share/fish/vendor_completions.d/criguard.fish"
chmod -R u=rwX,go=rX "$root/usr" "$root/etc" "$root/lib"

# Control files.
install -d "$root/DEBIAN"
# The newest glibc symbol version the binary needs; without binutils, the
# glibc of the machine it was built for (an upper bound).
if command -v objdump >/dev/null; then
    glibc="$(objdump -T "$root/usr/bin/criguard" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
else
    glibc="$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)"
fi
size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@GLIBC@/$glibc/" -e "s/@SIZE@/$size/" \
    packaging/deb/control.in >"$root/DEBIAN/control"
printf '/etc/criguard/config.toml\n/etc/default/criguard\n' >"$root/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "packaging/deb/$script" "$root/DEBIAN/$script"
done
(cd "$root" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -print0 |
    sort -z | xargs -0 md5sum | sed 's|  \./|  |') >"$root/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/criguard_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$root" "$deb" >/dev/null
echo "$deb"
