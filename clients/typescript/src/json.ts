/**
 * Values in and out: the §2 checks that JavaScript can break, the compact
 * JSON text the store keeps, and a parser that never rounds an integer.
 *
 * JSON numbers past 2^53 lose precision in JavaScript, so the client never
 * writes one silently (an unsafe integer-valued number is InvalidValue; a
 * bigint within 64 bits is written exactly) and never reads one silently (a
 * stored integer outside ±(2^53−1) comes back as a bigint where it stands).
 */

import { InvalidKey, InvalidValue, StorageError, TooLarge } from "./errors.js";

/** A value the store keeps: JSON, with bigint for integers past ±(2^53−1). */
export type JsonValue = null | boolean | number | bigint | string | JsonValue[] | JsonObject;
/** A JSON object. */
export type JsonObject = { [key: string]: JsonValue };

const MAX_DEPTH = 512; // [] is 1 level
const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;
const KEY = /^[A-Za-z0-9._:-]{1,200}$/;
export const SCOPE_KINDS = ["thread", "session", "agent", "user", "app"] as const;
export type ScopeKind = (typeof SCOPE_KINDS)[number];

/** `key` if it follows the key rules (1–200 of A–Z a–z 0–9 . _ : -), else InvalidKey. */
export function checkKey(key: unknown, what = "key"): string {
  if (typeof key !== "string" || !KEY.test(key)) {
    throw new InvalidKey(`${what} must be 1-200 characters of A-Z a-z 0-9 . _ : -, got ${show(key)}`);
  }
  return key;
}

export function checkKind(kind: unknown): ScopeKind {
  if (typeof kind !== "string" || !(SCOPE_KINDS as readonly string[]).includes(kind)) {
    throw new InvalidKey(`scope kind must be one of ${SCOPE_KINDS.join(", ")}, got ${show(kind)}`);
  }
  return kind as ScopeKind;
}

/** What fences a write (SPEC §14): a `Turn`, or a turn id. */
export type Fence = string | { readonly id: string };

/** The turn id of a `fence` option, or undefined; else InvalidValue (InvalidKey for a bad id). */
export function fenceOf(fence: unknown): string | undefined {
  if (fence === undefined || fence === null) return undefined;
  const id = typeof fence === "object" ? (fence as { id?: unknown }).id : fence;
  if (typeof id !== "string") throw new InvalidValue(`fence must be a Turn or a turn id, got ${show(fence)}`);
  return checkKey(id, "fence (a turn id)");
}

/** An integer parameter (a version, a count) from `lo` up; else InvalidValue. */
export function checkInt(name: string, v: unknown, lo = 0): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < lo) {
    throw new InvalidValue(`${name} must be an integer from ${lo}, got ${show(v)}`);
  }
  return v;
}

/** Seconds (ttl, lease, timeout): a finite number > 0; else InvalidValue. */
export function checkSeconds(name: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
    throw new InvalidValue(`${name} must be a number of seconds > 0, got ${show(v)}`);
  }
  return v;
}

/** An age in seconds, 0 or more (prune's `olderThan`, `idleFor`); else InvalidValue. */
export function checkAge(name: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v >= 1e11) {
    throw new InvalidValue(`${name} must be a number of seconds >= 0, got ${show(v)}`);
  }
  return v;
}

export function show(x: unknown): string {
  let s: string;
  try {
    s = typeof x === "string" ? JSON.stringify(x) : typeof x === "bigint" ? `${x}n` : String(x);
  } catch {
    s = Object.prototype.toString.call(x);
  }
  return s.length <= 60 ? s : s.slice(0, 57) + "...";
}

const hasWellFormed = typeof (String.prototype as { isWellFormed?: unknown }).isWellFormed === "function";
const LONE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function checkString(s: string, what: string): void {
  if (s.includes("\0")) throw new InvalidValue(`${what} may not contain NUL (U+0000)`);
  const ok = hasWellFormed ? (s as unknown as { isWellFormed(): boolean }).isWellFormed() : !LONE.test(s);
  if (!ok) throw new InvalidValue(`${what} may not contain a lone surrogate`);
}

function isPlain(o: object): boolean {
  const proto = Object.getPrototypeOf(o);
  // Object.prototype of this realm or another (a vm context, an iframe), or none.
  return proto === null || Object.getPrototypeOf(proto) === null;
}

/**
 * Walk a value by the §2 rules and tell whether it needs our own writer
 * (a bigint, or a float that Python spells with an exponent) rather than
 * JSON.stringify. Recursion is bounded by MAX_DEPTH, so a cycle is refused
 * as too deep, never a stack overflow.
 */
function check(v: unknown, depth: number): boolean {
  switch (typeof v) {
    case "string":
      checkString(v, "strings");
      return false;
    case "boolean":
      return false;
    case "number":
      if (!Number.isFinite(v)) throw new InvalidValue(`${v} is not JSON (NaN and ±Infinity are refused)`);
      if (Number.isInteger(v)) {
        if (!Number.isSafeInteger(v)) {
          throw new InvalidValue(`the number ${v} is beyond ±(2^53-1), where JavaScript rounds: ` +
            "write it as a bigint");
        }
        return false;
      }
      return Math.abs(v) < 1e-4;
    case "bigint":
      if (v < I64_MIN || v > I64_MAX) throw new InvalidValue(`integer ${v} is outside the signed 64-bit range`);
      return true;
    case "object": {
      if (v === null) return false;
      if (depth >= MAX_DEPTH) throw new InvalidValue(`nesting deeper than ${MAX_DEPTH} levels`);
      let special = false;
      if (Array.isArray(v)) {
        for (let i = 0; i < v.length; i++) {
          if (!(i in v) || v[i] === undefined) throw new InvalidValue("undefined (or a hole) inside an array is not JSON");
          if (check(v[i], depth + 1)) special = true;
        }
        return special;
      }
      if (!isPlain(v)) {
        const name = (v as { constructor?: { name?: string } }).constructor?.name ?? "object";
        throw new InvalidValue(`a ${name} is not JSON: only plain objects, arrays, strings, numbers, ` +
          "bigints, booleans and null");
      }
      for (const k of Object.keys(v)) {
        const item = (v as Record<string, unknown>)[k];
        if (item === undefined) continue; // left out, as JSON.stringify does
        checkString(k, "object keys");
        if (check(item, depth + 1)) special = true;
      }
      return special;
    }
    default: // undefined, function, symbol
      throw new InvalidValue(`${typeof v === "function" ? "a function" : typeof v} is not JSON`);
  }
}

/** Python's spelling of a float under 1e-4 (`1e-05`, not JavaScript's `0.00001` or `1e-5`). */
function pyFloat(x: number): string {
  return x.toExponential().replace(/e([+-])(\d)$/, "e$10$2");
}

function write(v: unknown): string {
  switch (typeof v) {
    case "string":
      return JSON.stringify(v);
    case "number":
      return Number.isInteger(v) || Math.abs(v) >= 1e-4 ? String(v) : pyFloat(v);
    case "bigint":
      return v.toString();
    case "boolean":
      return v ? "true" : "false";
    default: {
      if (v === null) return "null";
      if (Array.isArray(v)) return "[" + v.map(write).join(",") + "]";
      const parts: string[] = [];
      for (const k of Object.keys(v as object)) {
        const item = (v as Record<string, unknown>)[k];
        if (item !== undefined) parts.push(JSON.stringify(k) + ":" + write(item));
      }
      return "{" + parts.join(",") + "}";
    }
  }
}

/**
 * The compact JSON text of a value, after the §2 checks (InvalidValue): the
 * text the store keeps, byte for byte as Python writes it for the same value
 * (separators `,` `:`, raw UTF-8, Python's float spelling).
 */
export function encode(value: unknown): string {
  return check(value, 0) ? write(value) : JSON.stringify(value);
}

/** A value's size limit (SPEC §2): its compact UTF-8 JSON, or bytes; a list counted whole. */
export const MAX_VALUE = 1024 * 1024;
/** A run entry's or snapshot's (SPEC §3). */
export const MAX_RECORD = 16 * 1024 * 1024;

/** Bytes of the UTF-8 encoding of `s` (a well-formed string: `encode` refused lone surrogates). */
export function utf8Size(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    // 2 bytes from U+0080, 3 from U+0800; a surrogate pair is 4, 2 for each half.
    if (c >= 0x80) n += c >= 0x800 && (c < 0xd800 || c > 0xdfff) ? 2 : 1;
  }
  return n;
}

/** TooLarge, as Python reports it, when `size` bytes of `what` are over `limit`. */
export function checkSize(size: number, limit: number, what = "value"): void {
  if (size > limit) throw new TooLarge(`${what} is ${size} bytes, over the limit of ${limit}`, size, limit);
}

/**
 * `encode(value)`, refused with TooLarge before anything is sent when its UTF-8 is over `limit`
 * bytes (`what`: "list" for the items of an append, counted as the JSON of the list they make).
 */
export function encodeSized(value: unknown, limit = MAX_VALUE, what = "value"): string {
  const text = encode(value);
  if (text.length * 3 > limit) checkSize(utf8Size(text), limit, what); // else it cannot be over
  return text;
}

// -- reading -----------------------------------------------------------------------------

const LONG_DIGITS = /\d{16}/; // 15 digits or fewer: always a safe integer
const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;

/**
 * Parse JSON, keeping integers outside ±(2^53−1) exact as bigints.
 * Text without a run of 16 digits goes to JSON.parse; the rest to the parser below.
 */
export function parse(text: string): unknown {
  if (!LONG_DIGITS.test(text)) return JSON.parse(text);
  return new Parser(text).document();
}

class Parser {
  private i = 0;
  constructor(private readonly s: string) {}

  document(): unknown {
    const v = this.value();
    this.ws();
    if (this.i !== this.s.length) this.fail();
    return v;
  }

  private fail(): never {
    throw new SyntaxError(`not JSON at position ${this.i}`);
  }

  private ws(): void {
    const s = this.s;
    let c = s.charCodeAt(this.i);
    while (c === 32 || c === 10 || c === 13 || c === 9) c = s.charCodeAt(++this.i);
  }

  private value(): unknown {
    this.ws();
    const c = this.s.charCodeAt(this.i);
    if (c === 123) return this.object();
    if (c === 91) return this.array();
    if (c === 34) return this.string();
    if (this.s.startsWith("true", this.i)) { this.i += 4; return true; }
    if (this.s.startsWith("false", this.i)) { this.i += 5; return false; }
    if (this.s.startsWith("null", this.i)) { this.i += 4; return null; }
    return this.number();
  }

  private object(): Record<string, unknown> {
    const o: Record<string, unknown> = {};
    this.i++;
    this.ws();
    if (this.s.charCodeAt(this.i) === 125) { this.i++; return o; }
    for (;;) {
      this.ws();
      if (this.s.charCodeAt(this.i) !== 34) this.fail();
      const k = this.string();
      this.ws();
      if (this.s.charCodeAt(this.i++) !== 58) this.fail();
      const v = this.value();
      // An own "__proto__" key, as JSON.parse makes, never the object's prototype.
      if (k === "__proto__") Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
      else o[k] = v;
      this.ws();
      const c = this.s.charCodeAt(this.i++);
      if (c === 125) return o;
      if (c !== 44) this.fail();
    }
  }

  private array(): unknown[] {
    const a: unknown[] = [];
    this.i++;
    this.ws();
    if (this.s.charCodeAt(this.i) === 93) { this.i++; return a; }
    for (;;) {
      a.push(this.value());
      this.ws();
      const c = this.s.charCodeAt(this.i++);
      if (c === 93) return a;
      if (c !== 44) this.fail();
    }
  }

  private string(): string {
    const s = this.s;
    const start = this.i;
    let j = start + 1;
    let escaped = false;
    for (;;) {
      const c = s.charCodeAt(j);
      if (c === 34) break;
      if (c === 92) { escaped = true; j += 2; continue; }
      if (!(c >= 32)) this.fail(); // a control character, or the end of the text (NaN)
      j++;
    }
    this.i = j + 1;
    return escaped ? (JSON.parse(s.slice(start, j + 1)) as string) : s.slice(start + 1, j);
  }

  private number(): number | bigint {
    NUMBER.lastIndex = this.i;
    const m = NUMBER.exec(this.s);
    if (m === null) this.fail();
    const t = m[0];
    this.i += t.length;
    const n = Number(t);
    if (m[1] === undefined && m[2] === undefined && !Number.isSafeInteger(n)) return BigInt(t);
    return n;
  }
}

/**
 * The items of the array `field` of a JSON object's text, each as its own text, cut out of
 * `text` without decoding it (the server sends stored entries as they are stored).
 */
export function rawItems(text: string, field: string): string[] {
  const t = text.trim();
  if (t[0] !== "{" || t[t.length - 1] !== "}") throw new SyntaxError("not a JSON object");
  for (const member of splitTop(t, 1, t.length - 1)) {
    if (member[0] !== '"') throw new SyntaxError("not a JSON object");
    const end = closingQuote(member, 0);
    if (JSON.parse(member.slice(0, end + 1)) !== field) continue;
    const value = member.slice(end + 1).replace(/^\s*:\s*/, "");
    if (value[0] !== "[" || value[value.length - 1] !== "]") throw new SyntaxError(`${field} is not an array`);
    return splitTop(value, 1, value.length - 1);
  }
  throw new SyntaxError(`no field ${field}`);
}

/** The comma-separated texts of `s` from `from` to `to`, at the top level of that span. */
function splitTop(s: string, from: number, to: number): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = from;
  for (let i = from; i < to; i++) {
    const c = s.charCodeAt(i);
    if (c === 34) i = closingQuote(s, i);
    else if (c === 123 || c === 91) depth++;
    else if (c === 125 || c === 93) depth--;
    else if (c === 44 && depth === 0) {
      out.push(s.slice(start, i).trim());
      start = i + 1;
    }
  }
  const last = s.slice(start, to).trim();
  if (last !== "" || out.length > 0) out.push(last);
  return out;
}

/** The index of the quote that closes the string opening at `i`. */
function closingQuote(s: string, i: number): number {
  let j = i;
  for (;;) {
    j = s.indexOf('"', j + 1);
    if (j < 0) throw new SyntaxError("an unterminated string");
    let backslashes = 0;
    while (s.charCodeAt(j - 1 - backslashes) === 92) backslashes++;
    if (backslashes % 2 === 0) return j;
  }
}

/** An answer's JSON; a body that is not JSON is a StorageError (a proxy's page, a cut answer). */
export function parseAnswer(text: string, write: boolean): unknown {
  try {
    return parse(text);
  } catch (e) {
    throw new StorageError(`the server's answer is not JSON (${(e as Error).message})`, write);
  }
}
