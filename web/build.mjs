// Bundles web/src into web/dist with esbuild and writes the licenses of
// every npm package that ended up in a bundle (web/dist/THIRD-PARTY-LICENSES.txt).
// Run through web/build, which installs the pinned versions first.
import * as esbuild from "esbuild";
import fs from "node:fs";
import zlib from "node:zlib";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const dist = path.join(here, "dist");
fs.rmSync(dist, { recursive: true, force: true });
fs.mkdirSync(dist);

const result = await esbuild.build({
  absWorkingDir: here,
  entryPoints: { playground: "src/playground.js", dashboard: "src/dashboard.js" },
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  outdir: dist,
  metafile: true,
  // The licenses go into one file of their own, next to the bundles.
  legalComments: "none",
  logLevel: "warning",
});

for (const page of ["playground.html", "dashboard.html"]) {
  fs.copyFileSync(path.join(here, "src", page), path.join(dist, page));
}

// The npm packages whose files are in a bundle, from esbuild's metafile.
const packages = new Map();
for (const input of Object.keys(result.metafile.inputs)) {
  const match = input.match(/^node_modules\/((?:@[^/]+\/)?[^/]+)\//);
  if (match) packages.set(match[1], path.join(here, "node_modules", match[1]));
}
const sections = [...packages.keys()].sort().map((name) => {
  const dir = packages.get(name);
  const meta = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
  const file = fs.readdirSync(dir).find((f) => /^(licen[cs]e|copying)(\.|$)/i.test(f));
  if (!file) throw new Error(`${name}: no license file in the package`);
  const text = fs.readFileSync(path.join(dir, file), "utf8").trim();
  return `${"=".repeat(78)}\n${meta.name} ${meta.version} (${meta.license})\n${"=".repeat(78)}\n\n${text}\n`;
});
fs.writeFileSync(
  path.join(dist, "THIRD-PARTY-LICENSES.txt"),
  "The code-runner web pages bundle these npm packages, at these exact versions\n" +
    "(web/package-lock.json); each is under the license that follows its name.\n\n" +
    sections.join("\n"),
);
// The big bundle also goes precompressed (gzip's header carries no time
// here, so the output stays deterministic); the server sends it to
// browsers that accept gzip.
const big = path.join(dist, "playground.js");
fs.writeFileSync(`${big}.gz`, zlib.gzipSync(fs.readFileSync(big), { level: 9 }));
console.log(`dist/playground.js.gz  ${(fs.statSync(`${big}.gz`).size / 1024).toFixed(0)} KiB`);
for (const [file, { bytes }] of Object.entries(result.metafile.outputs)) {
  console.log(`${file}  ${(bytes / 1024).toFixed(0)} KiB`);
}
console.log(`dist/THIRD-PARTY-LICENSES.txt  ${packages.size} packages`);
