// The globals of Node.js that TypeScript programs use, loosely typed: Debian
// packages TypeScript but not @types/node, so code-runner ships these.
// Modules from require() are `any`.
declare var process: any;
declare var Buffer: any;
declare var module: any;
declare var exports: any;
declare var global: any;
declare var __dirname: string;
declare var __filename: string;
declare function require(id: string): any;
declare var console: {
    log(...data: any[]): void;
    error(...data: any[]): void;
    warn(...data: any[]): void;
    info(...data: any[]): void;
    debug(...data: any[]): void;
};
declare function setTimeout(callback: (...args: any[]) => void, ms?: number, ...args: any[]): any;
declare function clearTimeout(handle: any): void;
declare function setInterval(callback: (...args: any[]) => void, ms?: number, ...args: any[]): any;
declare function clearInterval(handle: any): void;
declare function setImmediate(callback: (...args: any[]) => void, ...args: any[]): any;
declare class TextEncoder { encode(input?: string): Uint8Array; }
declare class TextDecoder { constructor(label?: string); decode(input?: Uint8Array): string; }
