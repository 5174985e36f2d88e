"""Writes the install step of a language's libraries for scripts/build-images.

usage: libraries.py CATALOG LANGUAGE_ID OUT_DIR

Reads the language's `libraries` from runner-images/languages.toml and, when
it has any, writes OUT_DIR/install.sh (run as root while the image is built,
with the network of the build: the package registries only) and prints the
packages it installs, copies the
build host's CA bundle beside it when there is one (so a registry behind the
host's TLS setup is trusted exactly as on the host; it is removed with the
script), and the npm bootstrap when an npm package is listed. Exits 0 when
it wrote a step, 3 when the language has no libraries. Every name and
version is shell-quoted; the daemon's catalog check (src/languages.rs)
refuses the ones that are not package names at all.
"""
import os
import shlex
import shutil
import sys
import tomllib

# npm itself, fetched from the registry by node when an npm package is
# listed (Debian's npm package pulls in hundreds of packages and takes
# minutes); the integrity is the registry's, pinned here.
NPM_VERSION = "9.9.4"
NPM_INTEGRITY = "sha512-NzcQiLpqDuLhavdyJ2J3tGJ/ni/ebcqHVFZkv1C4/6lblraUPbPgCJ4Vhb4oa3FFhRa2Yj9gA58jGH/ztKueNQ=="
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
HERE = "/tmp/code-runner-libraries"

FETCH_NPM = r"""
const crypto = require('crypto');
const fs = require('fs');
const [version, integrity, out] = process.argv.slice(2);
(async () => {
  const url = `https://registry.npmjs.org/npm/-/npm-${version}.tgz`;
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  const body = Buffer.from(await response.arrayBuffer());
  const got = 'sha512-' + crypto.createHash('sha512').update(body).digest('base64');
  if (got !== integrity) throw new Error(`${url}: integrity ${got}, expected ${integrity}`);
  fs.writeFileSync(out, body);
})().catch((e) => { console.error(`libraries: cannot fetch npm: ${e.message}`); process.exit(1); });
"""


def main():
    catalog_path, language_id, out = sys.argv[1:4]
    with open(catalog_path, "rb") as f:
        catalog = tomllib.load(f)
    language = next((l for l in catalog.get("language", []) if l.get("id") == language_id), None)
    if language is None:
        sys.exit(f"libraries: no language {language_id!r} in {catalog_path}")
    libraries = language.get("libraries", [])
    if not libraries:
        sys.exit(3)
    by_source = {"debian": [], "pypi": [], "npm": []}
    for library in libraries:
        name, version, source = library.get("name"), library.get("version"), library.get("source")
        if source not in by_source or not isinstance(name, str) or not name:
            sys.exit(f"libraries: {language_id}: bad library entry {library!r}")
        if source != "debian" and not version:
            sys.exit(f"libraries: {language_id}: {name} ({source}) needs a pinned version")
        separator = {"debian": "=", "pypi": "==", "npm": "@"}[source]
        by_source[source].append(name + (separator + version if version else ""))

    os.makedirs(out, exist_ok=True)
    lines = ["#!/bin/sh", f"# The libraries of {language_id} (runner-images/languages.toml).", "set -eu", "export DEBIAN_FRONTEND=noninteractive"]
    quoted = lambda specs: " ".join(shlex.quote(s) for s in specs)
    if os.path.isfile(HOST_CA):
        shutil.copyfile(HOST_CA, os.path.join(out, "ca.crt"))
        lines.append(f"ca={HERE}/ca.crt")
    else:
        lines += ["apt-get update", "apt-get install -y --no-install-recommends ca-certificates", "ca=/etc/ssl/certs/ca-certificates.crt"]
    lines.append("apt-get update")
    if by_source["debian"]:
        lines.append(f"apt-get install -y --no-install-recommends {quoted(by_source['debian'])}")
    if by_source["pypi"]:
        lines += [
            "command -v python3 >/dev/null || { echo 'libraries: pypi packages need python3 in the image' >&2; exit 1; }",
            "apt-get install -y --no-install-recommends python3-pip",
            "PIP_CERT=$ca PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install --no-cache-dir "
            f"--break-system-packages --only-binary=:all: --no-warn-script-location {quoted(by_source['pypi'])}",
            "apt-get purge -y --auto-remove python3-pip",
        ]
    if by_source["npm"]:
        with open(os.path.join(out, "fetch-npm.js"), "w") as f:
            f.write(FETCH_NPM)
        lines += [
            "command -v node >/dev/null || { echo 'libraries: npm packages need node in the image' >&2; exit 1; }",
            f"NODE_EXTRA_CA_CERTS=$ca node {HERE}/fetch-npm.js {NPM_VERSION} {shlex.quote(NPM_INTEGRITY)} {HERE}/npm.tgz",
            f"mkdir -p {HERE}/npm {HERE}/prefix",
            f"tar -xzf {HERE}/npm.tgz -C {HERE}/npm",
            f"node {HERE}/npm/package/bin/npm-cli.js install --cafile \"$ca\" --no-audit --no-fund "
            f"--loglevel=error --cache {HERE}/cache --prefix {HERE}/prefix {quoted(by_source['npm'])}",
            # Found from any program under /workspace: `require` and `import`
            # both look in the node_modules of every parent directory.
            "mkdir -p /node_modules",
            f"cp -a {HERE}/prefix/node_modules/. /node_modules/",
        ]
    lines.append("rm -rf /var/lib/apt/lists/*")
    with open(os.path.join(out, "install.sh"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(" ".join(spec for specs in by_source.values() for spec in specs))


if __name__ == "__main__":
    main()
