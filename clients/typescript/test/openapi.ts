/**
 * The client's route table and answer shapes (src/wire.ts) against the
 * server's OpenAPI document: what one has and the other lacks, as a list of
 * problems (empty when they agree).
 */

import { NOT_CALLED, ROUTES, type Described, type Route } from "#internal/wire.js";

type Schema = {
  type?: string | string[]; properties?: Record<string, Schema>; required?: string[]; items?: Schema;
  additionalProperties?: Schema | boolean; anyOf?: Schema[];
};
type Operation = {
  parameters?: { name: string; in: string }[];
  requestBody?: { content: Record<string, { schema: Schema }> };
  responses: Record<string, { content?: Record<string, { schema: Schema }> }>;
};
export type Doc = { paths: Record<string, Record<string, Operation>> };

/** Every route of the table, flattened. */
export function clientRoutes(): Route[] {
  const out: Route[] = [];
  const walk = (o: unknown): void => {
    if (o && typeof o === "object" && "method" in o && "path" in o) out.push(o as Route);
    else if (o && typeof o === "object") Object.values(o).forEach(walk);
  };
  walk(ROUTES);
  return out;
}

function typeName(s: Schema): string {
  return Array.isArray(s.type) ? s.type.join("|") : s.type ?? "any";
}

function compare(desc: Described, s: Schema, where: string, problems: string[]): void {
  if (typeof desc === "string") {
    if (typeName(s) !== desc) problems.push(`${where}: the client reads ${desc}, the server sends ${typeName(s)}`);
    return;
  }
  if (Array.isArray(desc)) {
    if (typeName(s) !== "array") problems.push(`${where}: the client reads a list, the server sends ${typeName(s)}`);
    else compare(desc[0], s.items ?? {}, `${where}[]`, problems);
    return;
  }
  if (typeName(s) !== "object") {
    problems.push(`${where}: the client reads an object, the server sends ${typeName(s)}`);
    return;
  }
  const fields = desc as Record<string, Described>;
  if (Object.keys(fields).join() === "*") { // a map: every value of one shape
    const values = s.additionalProperties;
    if (typeof values !== "object" || s.properties !== undefined) {
      problems.push(`${where}: the client reads a map, the server sends an object of named fields`);
    } else {
      compare(fields["*"]!, values, `${where}{}`, problems);
    }
    return;
  }
  const props = s.properties ?? {};
  const required = new Set(s.required ?? []);
  for (const f of Object.keys(props)) if (!(f in fields)) problems.push(`${where}.${f}: sent by the server, unknown to the client's types`);
  for (const [f, d] of Object.entries(fields)) {
    const p = props[f];
    const optional = typeof d === "string" && d.endsWith("?");
    if (p === undefined) {
      problems.push(`${where}.${f}: in the client's types, not sent by the server`);
      continue;
    }
    if (optional && required.has(f)) problems.push(`${where}.${f}: always sent by the server, optional in the client's types`);
    if (!optional && !required.has(f)) problems.push(`${where}.${f}: the server may leave it out, the client's types say it is always there`);
    compare(optional ? d.slice(0, -1) : d, p, `${where}.${f}`, problems);
  }
}

function bodyFields(op: Operation): Set<string> {
  const schema = op.requestBody?.content["application/json"]?.schema;
  const all = new Set<string>();
  for (const s of schema?.anyOf ?? (schema ? [schema] : [])) for (const f of Object.keys(s.properties ?? {})) all.add(f);
  return all;
}

/** What the document and the client disagree on. */
export function disagreements(doc: Doc, routes: Route[] = clientRoutes(), notCalled = NOT_CALLED): string[] {
  const problems: string[] = [];
  const known = new Set<string>();
  for (const r of routes) {
    const name = `${r.method} ${r.path}`;
    known.add(name);
    const op = doc.paths[r.path]?.[r.method.toLowerCase()];
    if (op === undefined) {
      problems.push(`${name}: called by the client, not in the server's document`);
      continue;
    }
    const [status, ok] = Object.entries(op.responses).find(([code]) => code.startsWith("2")) ?? [];
    if (r.answer === "text/event-stream") {
      if (!ok?.content?.["text/event-stream"]) problems.push(`${name}: the server's answer is not an event stream`);
    } else {
      const schema = ok?.content?.["application/json"]?.schema;
      if (schema === undefined) problems.push(`${name}: no JSON answer in the document (${status})`);
      else compare(r.answer, schema, name, problems);
    }
    const headers = new Set((op.parameters ?? []).filter((p) => p.in === "header").map((p) => p.name.toLowerCase()));
    if (r.fence && !headers.has("x-agentstate-fence")) problems.push(`${name}: the client fences it, the server takes no X-Agentstate-Fence`);
    const query = new Set((op.parameters ?? []).filter((p) => p.in === "query").map((p) => p.name));
    for (const q of r.query ?? []) if (!query.has(q)) problems.push(`${name}: the client sends ?${q}, which the server does not take`);
    const body = bodyFields(op);
    for (const f of r.body ?? []) if (!body.has(f)) problems.push(`${name}: the client sends the body field ${f}, which the server does not take`);
  }
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const method of Object.keys(ops)) {
      const name = `${method.toUpperCase()} ${path}`;
      if (!known.has(name) && !(name in notCalled)) {
        problems.push(`${name}: a route of the server that the client neither calls nor lists in NOT_CALLED`);
      }
    }
  }
  for (const name of Object.keys(notCalled)) {
    const [method, path] = name.split(" ");
    if (!doc.paths[path!]?.[method!.toLowerCase()]) problems.push(`${name}: listed in NOT_CALLED, not in the server's document`);
  }
  return problems;
}
