// Drives a server through the unmodified npm package piston-client.
//   node piston.mjs SERVER runtimes
//   node piston.mjs SERVER execute LANGUAGE CODE_FILE [CONFIG_JSON]
// Prints what the client returned, as JSON.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const dir = process.env.PISTON_CLIENT_DIR;
const { piston } = await import(pathToFileURL(`${dir}/index.js`).href);
const [server, command, language, codeFile, config] = process.argv.slice(2);
const client = piston({ server });
let result;
if (command === "runtimes") {
  result = await client.runtimes();
} else if (command === "execute") {
  const code = readFileSync(codeFile, "utf8");
  result = await client.execute(language, code, config ? JSON.parse(config) : {});
} else {
  throw new Error(`unknown command ${command}`);
}
if (result && result.success === false) {
  result = { success: false, error: String(result.error) };
}
process.stdout.write(JSON.stringify(result));
