#!/bin/sh
# mmdebstrap --customize-hook for code-runner/base: runs on the host with the
# finished root filesystem's path as $1, right before it is packed into a tarball.
set -eu
root="$1"

# The job workspace. At run time a size-limited tmpfs is mounted over it. Mode 1777
# like /tmp, because runc gives a tmpfs mount the mode of the directory it covers
# (its `mode=` option is overridden; `uid=`/`gid=` are kept), so this mode is what
# the sandbox sees under runc: uid 65534 can create files whoever owns the mount.
mkdir -p "$root/workspace"
chmod 1777 "$root/workspace"

# Sandboxes run as nobody:nogroup; Debian's base-passwd provides both.
grep -q '^nobody:x:65534:65534:' "$root/etc/passwd"
grep -q '^nogroup:x:65534:' "$root/etc/group"

# Keep later `apt-get install` layers small: no package caches, no translations,
# no recommends (the Dockerfiles also say --no-install-recommends).
cat > "$root/etc/apt/apt.conf.d/90code-runner" <<'CONF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
CONF

# Nothing that varies per build or is useless in a container.
rm -rf "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin \
	"$root/var/cache/apt/archives/"*.deb "$root/var/log/"*.log \
	"$root/var/cache/debconf/"*-old "$root/var/lib/dpkg/"*-old
: > "$root/etc/machine-id"
