#!/usr/bin/env bash
# Build the OCI image archives the criguard integration tests use, offline
# and reproducibly, from the static busybox binary (package busybox-static).
#
# Usage:
#   hack/images.sh OUTDIR
#       Builds OUTDIR/pause.tar   (registry.k8s.io/pause:3.9)
#       and    OUTDIR/busybox.tar (docker.io/library/busybox:criguard).
#   hack/images.sh OUTDIR --filler NAME SIZE_MIB
#       Builds OUTDIR/<sanitised-normalised-NAME>.tar: the busybox image plus
#       a second layer holding /filler/data, SIZE_MIB MiB of data derived
#       from NAME (so distinct names give distinct layers).
#   hack/images.sh OUTDIR --criguard BINARY NAME
#       Builds OUTDIR/<sanitised-normalised-NAME>.tar: criguard's image for
#       the DaemonSet (deploy/), BINARY (stripped) as /usr/bin/criguard with
#       the shared libraries it links (ldd), nothing else; its entrypoint
#       is criguard.
#
# Every produced archive path is printed on stdout, one per line; progress
# goes to stderr. Archives are OCI image layouts packed as (uncompressed)
# tarballs, suitable for `ctr images import`. Outputs that already exist and
# are newer than /bin/busybox and this script are reused. Safe to run
# concurrently on the same OUTDIR (flock + atomic rename).
#
# Image names given to --filler are normalised like docker does
# ("foo" -> "docker.io/library/foo:latest"); the sanitised file name is that
# full name with every character outside [A-Za-z0-9._-] replaced by "_",
# e.g. docker.io_library_foo_latest.tar.
set -euo pipefail
umask 022
export LC_ALL=C

BUSYBOX=/bin/busybox
SELF="$(readlink -f "${BASH_SOURCE[0]}")"

PAUSE_NAME="registry.k8s.io/pause:3.9"
BUSYBOX_NAME="docker.io/library/busybox:criguard"
IMAGE_PATH_ENV="PATH=/bin:/sbin:/usr/bin"

die() {
    echo "images.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SELF" >&2
    exit 2
}

# Deterministic tar: fixed order, timestamps, owners; GNU format so that no
# pax headers with atime/ctime sneak in.
det_tar() { # det_tar OUT.tar DIR
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        --format=gnu -C "$2" -cf "$1" .
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# OCI platform of this machine, from the Debian architecture name.
oci_platform() {
    local deb
    deb="$(dpkg --print-architecture)"
    case "$deb" in
        amd64) echo '"architecture":"amd64","os":"linux"' ;;
        arm64) echo '"architecture":"arm64","os":"linux","variant":"v8"' ;;
        armhf) echo '"architecture":"arm","os":"linux","variant":"v7"' ;;
        armel) echo '"architecture":"arm","os":"linux","variant":"v5"' ;;
        i386) echo '"architecture":"386","os":"linux"' ;;
        ppc64el) echo '"architecture":"ppc64le","os":"linux"' ;;
        *) echo "\"architecture\":\"$deb\",\"os\":\"linux\"" ;;
    esac
}

# Normalise an image reference the way docker/containerd's CRI do.
normalise_name() {
    local name="$1" first rest path
    [[ "$name" != *@* ]] || die "digest references are not supported: $name"
    [[ -n "$name" ]] || die "empty image name"
    first="${name%%/*}"
    if [[ "$name" == */* && ("$first" == *.* || "$first" == *:* || "$first" == localhost) ]]; then
        rest="$name"
    else
        case "$name" in
            */*) rest="docker.io/$name" ;;
            *) rest="docker.io/library/$name" ;;
        esac
    fi
    # Repository paths must be lower case (registry host and tag need not).
    path="${rest#*/}"
    [[ "${path##*/}" != *:* ]] || path="${path%:*}"
    [[ "$path" != *[A-Z]* ]] || die "image repository must be lower case: $name"
    # Add ":latest" when the last path component carries no tag.
    case "${rest##*/}" in
        *:*) ;;
        *) rest="$rest:latest" ;;
    esac
    echo "$rest"
}

sanitise() { printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_'; }

# Root filesystem shared by all images: static busybox, one symlink per
# applet in /bin, /sbin and /usr/bin pointing at /bin, root in /etc/passwd.
make_rootfs() { # make_rootfs DIR
    local root="$1" applet
    mkdir -p "$root"/{bin,dev,etc,proc,root,sys,usr,var}
    install -m 0755 "$BUSYBOX" "$root/bin/busybox"
    while IFS= read -r applet; do
        [[ -n "$applet" && "$applet" != busybox && "$applet" != */* ]] || continue
        ln -s busybox "$root/bin/$applet"
    done < <("$BUSYBOX" --list)
    ln -s bin "$root/sbin"
    ln -s ../bin "$root/usr/bin"
    ln -s ../bin "$root/usr/sbin"
    mkdir -p "$root/tmp" "$root/var/tmp"
    chmod 1777 "$root/tmp" "$root/var/tmp"
    chmod 0700 "$root/root"
    printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' \
        'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$root/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
    chmod 0644 "$root/etc/passwd" "$root/etc/group"
}

# Put a blob into an OCI layout; prints its digest (hex).
add_blob() { # add_blob LAYOUT FILE
    local d
    d="$(sha256_of "$2")"
    cp "$2" "$1/blobs/sha256/$d"
    echo "$d"
}

# Assemble an OCI layout from layer tars and a container-config JSON object,
# then pack it into OUT (written atomically).
# write_archive OUT NAME CONTAINER_CONFIG_JSON LAYER.tar...
write_archive() {
    local out="$1" name="$2" ccfg="$3"
    shift 3
    local work layout l d diff_ids="" layers="" cfg cfg_d man man_d platform tag
    work="$(mktemp -d "$TMP_ROOT/archive.XXXXXX")"
    layout="$work/layout"
    mkdir -p "$layout/blobs/sha256"
    platform="$(oci_platform)"
    tag="${name##*:}"

    # Layers are uncompressed, so digest == diff_id.
    for l in "$@"; do
        d="$(add_blob "$layout" "$l")"
        diff_ids+="${diff_ids:+,}\"sha256:$d\""
        layers+="${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$d\",\"size\":$(size_of "$l")}"
    done

    # Image config (fixed "created" for reproducibility).
    cfg="$work/config.json"
    printf '{%s,"config":%s,"created":"1970-01-01T00:00:00Z","history":[{"created":"1970-01-01T00:00:00Z","created_by":"criguard hack/images.sh"}],"rootfs":{"type":"layers","diff_ids":[%s]}}' \
        "$platform" "$ccfg" "$diff_ids" >"$cfg"
    cfg_d="$(add_blob "$layout" "$cfg")"

    # Manifest.
    man="$work/manifest.json"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
        "$cfg_d" "$(size_of "$cfg")" "$layers" >"$man"
    man_d="$(add_blob "$layout" "$man")"

    # Index, naming the image for containerd and by tag for OCI tools.
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{%s},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$man_d" "$(size_of "$man")" "$platform" "$name" "$tag" >"$layout/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    chmod 0644 "$layout/index.json" "$layout/oci-layout" "$layout"/blobs/sha256/*

    # Pack and move into place atomically.
    det_tar "$work/out.tar" "$layout"
    mv -f "$work/out.tar" "$out"
    rm -rf "$work"
    echo "images.sh: built $out ($name)" >&2
}

# True when FILE exists and is newer than busybox and this script.
fresh() { [[ -s "$1" && "$1" -nt "$BUSYBOX" && "$1" -nt "$SELF" ]]; }

# The base layer (the rootfs above), built once per run.
base_layer() {
    if [[ ! -f "$TMP_ROOT/base.tar" ]]; then
        make_rootfs "$TMP_ROOT/rootfs"
        det_tar "$TMP_ROOT/base.tar" "$TMP_ROOT/rootfs"
    fi
    echo "$TMP_ROOT/base.tar"
}

build_defaults() {
    local pause="$OUTDIR/pause.tar" bb="$OUTDIR/busybox.tar" base
    if ! fresh "$pause" || ! fresh "$bb"; then
        base="$(base_layer)"
        # pause: sleeps "forever" (~68 years); the CRI plugin kills sandboxes
        # with SIGKILL, so no signal handling is needed.
        write_archive "$pause" "$PAUSE_NAME" \
            "{\"Env\":[\"$IMAGE_PATH_ENV\"],\"Entrypoint\":[\"/bin/sleep\",\"2147483647\"],\"WorkingDir\":\"/\"}" \
            "$base"
        write_archive "$bb" "$BUSYBOX_NAME" \
            "{\"Env\":[\"$IMAGE_PATH_ENV\"],\"Cmd\":[\"/bin/sh\"],\"WorkingDir\":\"/\"}" \
            "$base"
    fi
    echo "$pause"
    echo "$bb"
}

build_filler() { # build_filler NAME SIZE_MIB
    local name size out stamp work
    name="$(normalise_name "$1")"
    size="$2"
    [[ "$size" =~ ^[0-9]+$ ]] || die "SIZE_MIB must be a non-negative integer, got '$size'"
    out="$OUTDIR/$(sanitise "$name").tar"
    # The stamp records what the archive was built for (size may change).
    stamp="$out.params"
    if ! fresh "$out" || [[ "$(cat "$stamp" 2>/dev/null || true)" != "$name $size" ]]; then
        work="$(mktemp -d "$TMP_ROOT/filler.XXXXXX")"
        mkdir -p "$work/root/filler"
        # Content derived from the name: distinct names -> distinct layers.
        yes "criguard filler $name" | head -c "$((size * 1024 * 1024))" >"$work/root/filler/data" || true
        [[ "$(size_of "$work/root/filler/data")" -eq $((size * 1024 * 1024)) ]] ||
            die "failed to generate filler data"
        chmod 0644 "$work/root/filler/data"
        det_tar "$work/filler.tar" "$work/root"
        write_archive "$out" "$name" \
            "{\"Env\":[\"$IMAGE_PATH_ENV\"],\"Cmd\":[\"/bin/sh\"],\"WorkingDir\":\"/\",\"Labels\":{\"io.criguard.filler.size-mib\":\"$size\"}}" \
            "$(base_layer)" "$work/filler.tar"
        printf '%s %s\n' "$name" "$size" >"$stamp.tmp"
        mv -f "$stamp.tmp" "$stamp"
        rm -rf "$work"
    fi
    echo "$out"
}

build_criguard() { # build_criguard BINARY NAME
    local bin="$1" name out work lib
    name="$(normalise_name "$2")"
    [[ -x "$bin" ]] || die "no criguard binary at $bin"
    out="$OUTDIR/$(sanitise "$name").tar"
    work="$(mktemp -d "$TMP_ROOT/criguard.XXXXXX")"
    mkdir -p "$work/root/usr/bin" "$work/root/etc" "$work/root/tmp"
    chmod 1777 "$work/root/tmp"
    strip --strip-all -o "$work/root/usr/bin/criguard" "$bin" 2>/dev/null ||
        install -m 0755 "$bin" "$work/root/usr/bin/criguard"
    # The dynamic loader and every library at the path the binary asks for.
    while IFS= read -r lib; do
        mkdir -p "$work/root$(dirname "$lib")"
        cp -L "$lib" "$work/root$lib"
    done < <(ldd "$bin" | grep -o '/[^ ]*' | sort -u)
    printf '%s\n' 'root:x:0:0:root:/:/usr/bin/criguard' >"$work/root/etc/passwd"
    printf '%s\n' 'root:x:0:' >"$work/root/etc/group"
    det_tar "$work/layer.tar" "$work/root"
    write_archive "$out" "$name" \
        "{\"Env\":[\"PATH=/usr/bin\"],\"Entrypoint\":[\"/usr/bin/criguard\"],\"WorkingDir\":\"/\"}" \
        "$work/layer.tar"
    rm -rf "$work"
    echo "$out"
}

# ---- main -------------------------------------------------------------------

[[ $# -ge 1 ]] || usage
[[ "$1" != -h && "$1" != --help ]] || usage
OUTDIR="$1"
shift
[[ -x "$BUSYBOX" ]] || die "$BUSYBOX not found (apt-get install busybox-static)"
file_out="$(LC_ALL=C od -An -c -N4 "$BUSYBOX" | tr -d ' ')"
[[ "$file_out" == '177ELF' ]] || die "$BUSYBOX is not an ELF binary"

mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"

# Serialise builders sharing OUTDIR (parallel test processes).
exec 9>"$OUTDIR/.lock"
flock 9

# Scratch space next to the outputs, so the final mv is an atomic rename.
TMP_ROOT="$(mktemp -d "$OUTDIR/.tmp.XXXXXX")"
trap 'rm -rf "$TMP_ROOT"' EXIT

case "${1:-}" in
    "")
        build_defaults
        ;;
    --filler)
        [[ $# -eq 3 ]] || usage
        build_filler "$2" "$3"
        ;;
    --criguard)
        [[ $# -eq 3 ]] || usage
        build_criguard "$2" "$3"
        ;;
    *)
        usage
        ;;
esac
