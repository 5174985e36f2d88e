#!/usr/bin/env bash
# Builds the shared base image of every runner image from Debian packages, with no
# image registry: mmdebstrap bootstraps a minimal bookworm root filesystem (the
# `apt` variant: Essential:yes packages + apt, merged /usr without the usrmerge
# package and its Perl), customize.sh finishes it, `docker import` makes the image.
#
#   runner-images/base/build.sh IMAGE [KEY=VALUE...]    (each KEY=VALUE becomes a label)
#
# Normally run by scripts/build-images, which labels it with the hash of this folder.
# No mirror is named: mmdebstrap uses Debian's default mirror for the suite.
set -euo pipefail

if [[ $# -lt 1 ]]; then
	echo "usage: $0 IMAGE [KEY=VALUE...]" >&2
	exit 64
fi
image="$1"
shift

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
suite=bookworm
hooks=/usr/share/mmdebstrap/hooks/merged-usr

command -v mmdebstrap >/dev/null || {
	echo "base: mmdebstrap is not installed (apt-get install mmdebstrap, or run scripts/up)" >&2
	exit 1
}
[[ -d "$hooks" ]] || {
	echo "base: $hooks is missing (mmdebstrap's hook directory)" >&2
	exit 1
}

work="$(mktemp -d "${TMPDIR:-/tmp}/code-runner-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log="$work/mmdebstrap.log"

# dpkg path excludes are written to /etc/dpkg/dpkg.cfg.d/ inside the image, so the
# language layers' apt-get installs skip documentation, man pages and translations too.
if ! mmdebstrap --variant=apt --mode=root --format=tar \
	--hook-dir="$hooks" \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-include=/usr/share/locale/locale.alias' \
	--dpkgopt='path-exclude=/usr/share/lintian/*' \
	--customize-hook="sh '$here/customize.sh' \"\$1\"" \
	"$suite" "$work/rootfs.tar" >"$log" 2>&1; then
	echo "base: mmdebstrap $suite failed; last lines of its log:" >&2
	tail -n 25 "$log" >&2
	exit 1
fi

changes=(
	--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
	--change 'ENV LANG=C.UTF-8'
	--change 'WORKDIR /workspace'
	--change 'CMD ["/bin/bash"]'
)
for kv in "$@"; do
	changes+=(--change "LABEL $kv")
done

if ! docker import "${changes[@]}" --message "code-runner base: mmdebstrap --variant=apt $suite" \
	"$work/rootfs.tar" "$image" >"$work/import.log" 2>&1; then
	echo "base: docker import of $image failed:" >&2
	cat "$work/import.log" >&2
	exit 1
fi
