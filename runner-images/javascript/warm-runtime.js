'use strict';
// code-runner's warm runtime for Node.js (see docs/warm-runtimes.md).
//
// Preloaded (`node --require` this file `main.js`) by the supervisor before
// the job came, with its control pipe as descriptor 200. Here Node has done its
// whole start-up except loading the main module; this waits for the job's
// args (each followed by a NUL byte, then EOF), appends them to process.argv
// as a cold start would have them, closes the pipe, and takes itself out of
// sight: process.execArgv no longer shows the --require (so fork() starts
// plain children) and require.cache forgets this file. Node then loads
// main.js exactly as on a cold start. Worker threads preload this file too
// (and inherit the --require in their execArgv): there it only takes the
// --require out of sight.
const hook = process.execArgv.indexOf('--require');
if (hook >= 0 && process.execArgv[hook + 1] === __filename) {
  process.execArgv.splice(hook, 2);
}
if (require('worker_threads').isMainThread) {
  const fs = require('fs');
  const chunks = [];
  const buffer = Buffer.alloc(65536);
  for (;;) {
    let read;
    try {
      read = fs.readSync(200, buffer, 0, buffer.length, null);
    } catch (error) {
      if (error.code === 'EAGAIN' || error.code === 'EINTR') continue;
      throw error;
    }
    if (read === 0) break;
    chunks.push(Buffer.from(buffer.subarray(0, read)));
  }
  fs.closeSync(200);
  const args = Buffer.concat(chunks).toString('utf8').split('\0');
  args.pop();
  process.argv.push(...args);
}
delete require.cache[__filename];
