#!/usr/bin/env bash
# Prepares the default Linux guest for exitless:
#   <dir>/bzImage            Debian's cloud kernel, as shipped
#   <dir>/vmlinux            the ELF kernel extracted from it (lz4 payload)
#   <dir>/initramfs.cpio.gz  a busybox-static initramfs with the virtio-pci modules; its /init
#                            reports each virtio disk (and mounts it if it holds a filesystem),
#                            the hwrng, each network card and the vsock device
# Usage: scripts/fetch-guest.sh [DIR]   (DIR defaults to guest/ at the repository root)
# Downloads and unpacked packages are kept in DIR/.work, so a second run fetches nothing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/guest}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$OUT/.work
DEBS=$WORK/debs
KROOT=$WORK/kernel
BBROOT=$WORK/busybox
META=linux-image-cloud-amd64
# virtio over PCI (exitless's transport), its devices (vsock's transport brings the vsock
# core), and ext4 to mount a disk that holds one.
MODULES=(virtio_pci virtio_blk virtio_rng virtio_net vmw_vsock_virtio_transport virtio_console ext4)

log() { printf '[fetch-guest] %s\n' "$*" >&2; }
die() { printf '[fetch-guest] error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the Debian packages providing the given commands, if any is missing.
need_tools() {
    local missing=() pair cmd pkg
    for pair in "$@"; do
        cmd=${pair%%:*}
        pkg=${pair#*:}
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        as_root apt-get install -y --no-install-recommends "${missing[@]}" >&2
    fi
}

# Runs `apt-get update` only when apt does not know the kernel metapackage yet.
ensure_apt_lists() {
    local policy
    policy=$(apt-cache policy "$META" 2>/dev/null || true)
    if ! grep -q 'Candidate: [^(]' <<<"$policy"; then
        log "apt has no candidate for $META: running apt-get update"
        as_root apt-get update >&2
    fi
}

# Downloads the .deb of package $1 into $DEBS unless one is already there; prints its path.
download() {
    local pkg=$1 deb
    deb=$(find "$DEBS" -maxdepth 1 -name "${pkg}_*.deb" | sort | tail -n 1)
    if [ -z "$deb" ]; then
        log "downloading $pkg"
        (cd "$DEBS" && apt-get download "$pkg" >&2)
        deb=$(find "$DEBS" -maxdepth 1 -name "${pkg}_*.deb" | sort | tail -n 1)
        [ -n "$deb" ] || die "apt-get download $pkg produced no .deb"
    fi
    printf '%s\n' "$deb"
}

# The versioned kernel package the metapackage depends on (signed or -unsigned).
resolve_kernel_package() {
    local pkg
    pkg=$(apt-cache depends "$META" |
        awk '/Depends:/ {print $2}' |
        grep -E '^linux-image-[0-9].*-cloud-amd64(-unsigned)?$' |
        head -n 1) || true
    [ -n "$pkg" ] || die "cannot resolve the kernel package behind $META"
    printf '%s\n' "$pkg"
}

# Unpacks .deb $1 into directory $2 once (a stamp file records which .deb it was).
unpack() {
    local deb=$1 dir=$2
    if [ "$(cat "$dir/.unpacked" 2>/dev/null || true)" != "$(basename "$deb")" ]; then
        log "unpacking $(basename "$deb")"
        rm -rf "$dir"
        mkdir -p "$dir"
        dpkg-deb -x "$deb" "$dir"
        basename "$deb" >"$dir/.unpacked"
    fi
}

is_elf() {
    [ -s "$1" ] && [ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ]
}

# Extracts the ELF vmlinux from bzImage $1 into $2: tries each lz4 legacy frame magic.
extract_vmlinux() {
    local bz=$1 out=$2 off
    while IFS=: read -r off _; do
        # lz4 complains about the bytes after the payload; only the ELF magic counts.
        tail -c "+$((off + 1))" "$bz" | lz4 -dc >"$out.tmp" 2>/dev/null || true
        if is_elf "$out.tmp"; then
            mv "$out.tmp" "$out"
            log "vmlinux: lz4 payload at offset $off"
            return 0
        fi
    done < <(LC_ALL=C grep -obUaP '\x02\x21\x4c\x18' "$bz" || true)
    rm -f "$out.tmp"
    die "no lz4 payload in $bz decompresses to an ELF image"
}

# Prints the content of module file $1, decompressing it if needed.
module_cat() {
    case "$1" in
    *.ko.xz) xz -dc "$1" ;;
    *.ko.zst) zstd -dcq "$1" ;;
    *.ko.gz) gzip -dc "$1" ;;
    *) cat "$1" ;;
    esac
}

# Prints the files (absolute paths) of modules $2.. and of their dependencies (read from
# each module's own "depends=" modinfo string, as no depmod output ships in the .deb),
# dependencies first, each once. Modules built into the kernel are reported and skipped.
module_load_order() {
    local moddir=$1
    shift
    local -A path=() seen=()
    local order=() f n
    while IFS= read -r f; do
        n=${f##*/}
        n=${n%%.ko*}
        path[${n//-/_}]=$f
    done < <(find "$moddir/kernel" -name '*.ko*')
    visit() {
        local name=${1//-/_} deps dep
        [ -n "${seen[$name]:-}" ] && return 0
        seen[$name]=1
        if [ -z "${path[$name]:-}" ]; then
            if grep -q "/$name\.ko" "$moddir/modules.builtin" 2>/dev/null; then
                log "module $name is built into the kernel"
            else
                log "module $name not found (skipped)"
            fi
            return 0
        fi
        deps=$(module_cat "${path[$name]}" | LC_ALL=C grep -aoP 'depends=[^\x00]*' |
            head -n 1 | cut -d= -f2) || true
        for dep in ${deps//,/ }; do
            visit "$dep"
        done
        order+=("${path[$name]}")
    }
    for n in "$@"; do
        visit "$n"
    done
    printf '%s\n' "${order[@]}"
}

# Copies the modules to $2/lib/modules (decompressed) and writes the load order file.
install_modules() {
    local moddir=$1 root=$2 f base
    mkdir -p "$root/lib/modules"
    : >"$root/lib/modules/load-order"
    while IFS= read -r f; do
        [ -n "$f" ] || continue
        base=${f##*/}
        base=${base%%.ko*}.ko
        module_cat "$f" >"$root/lib/modules/$base"
        echo "$base" >>"$root/lib/modules/load-order"
    done < <(module_load_order "$moddir" "${MODULES[@]}")
}

write_init() {
    cat >"$1/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec 0</dev/console 1>/dev/console 2>&1
for m in $(cat /lib/modules/load-order); do
    insmod "/lib/modules/$m" 2>/dev/null || true
done
# Report the devices exitless gave us (the boot tests read these lines).
for d in /sys/block/vd*; do
    [ -e "$d" ] || continue
    n=${d##*/}
    echo "exitless disk /dev/$n $(cat "$d/size") sectors ro=$(cat "$d/ro")"
    mkdir -p "/mnt/$n"
    if mount "/dev/$n" "/mnt/$n" 2>/dev/null; then
        echo "exitless disk /dev/$n mounted at /mnt/$n"
    fi
done
if [ -e /sys/class/misc/hw_random/rng_current ]; then
    echo "exitless hwrng $(cat /sys/class/misc/hw_random/rng_current)"
fi
for n in /sys/class/net/eth*; do
    [ -e "$n" ] || continue
    ip link set "${n##*/}" up 2>/dev/null
    echo "exitless net ${n##*/} mac=$(cat "$n/address")"
done
# /dev/vsock comes with the vsock core module; a bound device shows under its driver.
for v in /sys/bus/virtio/drivers/vmw_vsock_virtio_transport/virtio*; do
    [ -e "$v" ] && [ -e /dev/vsock ] && echo "exitless vsock ${v##*/} bound, /dev/vsock"
done
echo "exitless guest up"
setsid cttyhack sh || sh
echo "exitless guest shell exited: rebooting"
reboot -f
INIT
    chmod 0755 "$1/init"
}

build_initramfs() {
    local moddir=$1 out=$2 root=$WORK/initramfs
    rm -rf "$root"
    mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules}
    cp "$BBROOT/bin/busybox" "$root/bin/busybox"
    if [ "$(id -u)" -eq 0 ]; then
        mknod -m 600 "$root/dev/console" c 5 1
    fi
    install_modules "$moddir" "$root"
    write_init "$root"
    # Fixed timestamps and no gzip name/time: the same inputs give the same archive.
    find "$root" -exec touch -h -d @0 {} +
    (cd "$root" && find . -print0 | LC_ALL=C sort -z |
        cpio --null -o -H newc --owner=0:0 --reproducible --quiet) | gzip -9n >"$out.tmp"
    mv "$out.tmp" "$out"
}

main() {
    need_tools apt-get:apt dpkg-deb:dpkg lz4:lz4 cpio:cpio gzip:gzip xz:xz-utils
    mkdir -p "$DEBS"
    ensure_apt_lists
    local kpkg kdeb bbdeb vmlinuz moddir kver
    kpkg=$(resolve_kernel_package)
    log "kernel package: $kpkg"
    kdeb=$(download "$kpkg")
    bbdeb=$(download busybox-static)
    unpack "$kdeb" "$KROOT"
    unpack "$bbdeb" "$BBROOT"

    vmlinuz=$(find "$KROOT/boot" -maxdepth 1 -name 'vmlinuz-*' | sort | tail -n 1)
    [ -n "$vmlinuz" ] || die "no boot/vmlinuz-* in $kdeb"
    kver=${vmlinuz##*/vmlinuz-}
    moddir=$KROOT/lib/modules/$kver
    [ -d "$moddir/kernel" ] || die "no lib/modules/$kver/kernel in $kdeb"
    [ -x "$BBROOT/bin/busybox" ] || die "no bin/busybox in $bbdeb"

    cp "$vmlinuz" "$OUT/bzImage"
    extract_vmlinux "$OUT/bzImage" "$OUT/vmlinux"
    build_initramfs "$moddir" "$OUT/initramfs.cpio.gz"

    log "kernel $kver"
    log "modules: $(tr '\n' ' ' <"$WORK/initramfs/lib/modules/load-order")"
    ls -l "$OUT/bzImage" "$OUT/vmlinux" "$OUT/initramfs.cpio.gz" >&2
    local rel=${OUT#"$PWD"/}
    echo "exitless run --kernel $rel/vmlinux --initrd $rel/initramfs.cpio.gz"
}

main "$@"
