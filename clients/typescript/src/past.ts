/**
 * The store as it was right after a change (SPEC §17): `db.asOf(seq)`. Its scopes are the
 * present's `Scope`s with every read asking for that change (`?as_of=`) and every write a
 * UsageError; `db.diff`, `scope.history`, `scope.restore` and `sessions.fork` are on the
 * objects they belong to.
 */

import type { Http } from "./http.js";
import { checkInt, type ScopeKind } from "./json.js";
import { Scope, State, type UpdateTurns } from "./scope.js";

/**
 * `db.asOf(seq)`: `scope(kind, id)` and `state({...})` as on a Database, reads only. The seq
 * is checked by each read: past the newest change InvalidValue, older than the history kept
 * CursorExpired.
 */
export class Past {
  readonly seq: number;

  /** @internal */
  constructor(private readonly http: Http, private readonly turns: UpdateTurns, seq: number) {
    this.seq = checkInt("seq", seq);
  }

  /** The keys of one scope as they were. :throws InvalidKey */
  scope(kind: ScopeKind, id: string): Scope {
    return new Scope(this.http, this.turns, kind, id, false, undefined, this.seq);
  }

  /** Several scopes of one invocation, as they were; reading a member whose id was not given throws. */
  state(ids: Partial<Record<ScopeKind, string>>): State {
    return new State((kind, id) => this.scope(kind, id), ids);
  }
}
