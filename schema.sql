-- agentstate schema: the one and only copy. The package applies this file to
-- a new database in one transaction; PRAGMA user_version (last line) is the
-- schema version that migrations compare against.
--
-- Conventions: every table is STRICT; values are JSON text (never JSONB) so
-- json_extract works in any sqlite3 shell from 3.37 on; times are ISO-8601 UTC
-- text ('2026-11-30T12:00:00.000000Z'), which sorts in time order.

PRAGMA application_id = 1634952052;  -- 'agst': marks the file as ours

-- Keys of scoped state: one row per live (kind, scope_id, key). A rowid table
-- (not WITHOUT ROWID): values of a few KB then pack into pages instead of
-- spilling to overflow pages (benchmarks/LAYOUT.md: WITHOUT ROWID puts 150-byte
-- values 1.13x faster, one b-tree page fewer, but 1.5 KB ones 0.75x, and gets
-- from 1.5 KB up run ~0.5x).
CREATE TABLE kv (
    kind       TEXT    NOT NULL CHECK (kind IN ('thread', 'session', 'agent', 'user', 'app')),
    scope_id   TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    version    INTEGER NOT NULL CHECK (version >= 1),  -- +1 on every write of the key
    type       TEXT    NOT NULL CHECK (type IN ('json', 'bytes', 'list')),
    value      ANY,      -- json: JSON text; bytes: BLOB; list: NULL (items in list_item)
    list_id    INTEGER,  -- list: the list_id of its items; else NULL
    length     INTEGER,  -- list: number of items; else NULL
    size       INTEGER NOT NULL CHECK (size >= 0),  -- bytes of the compact JSON (a list: of the whole list)
    updated_at TEXT    NOT NULL,
    expires_at REAL,     -- unix time from which the key is absent to every reader; NULL: never
    PRIMARY KEY (kind, scope_id, key),
    CHECK ((type = 'list') = (list_id IS NOT NULL)),
    CHECK ((type = 'list') = (length IS NOT NULL)),
    CHECK ((type = 'list') = (value IS NULL))
) STRICT;

-- Items of list values, one row per item, so an append writes only the new
-- items and a slice reads only what it returns. idx runs 0..length-1.
-- Deleting or replacing a list deletes its items in the same transaction.
CREATE TABLE list_item (
    list_id INTEGER NOT NULL,
    idx     INTEGER NOT NULL CHECK (idx >= 0),
    item    TEXT    NOT NULL,  -- JSON text of one item
    PRIMARY KEY (list_id, idx)
) STRICT, WITHOUT ROWID;

-- No two keys share a list's items (and check() finds orphans by this index).
CREATE UNIQUE INDEX kv_list ON kv (list_id) WHERE list_id IS NOT NULL;

-- Keys that expire, soonest first: the purge reads only these.
CREATE INDEX kv_expiry ON kv (expires_at) WHERE expires_at IS NOT NULL;

-- The last list_id handed out (one row): a new list takes the next one.
CREATE TABLE list_seq (last INTEGER NOT NULL) STRICT;
INSERT INTO list_seq VALUES (0);

-- The last version of each deleted key. A re-created key continues from it,
-- so a stale if_version never matches a re-created key. Consulted only when a
-- key is created; a row may outlive the re-creation (the live version is higher).
CREATE TABLE kv_deleted (
    kind     TEXT    NOT NULL,
    scope_id TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    version  INTEGER NOT NULL,
    PRIMARY KEY (kind, scope_id, key)
) STRICT, WITHOUT ROWID;

-- Agent runs: one row per run, holding the replaceable snapshot.
CREATE TABLE run (
    id         TEXT    PRIMARY KEY,
    snapshot   TEXT,               -- JSON object, or NULL before the first one
    next_seq   INTEGER NOT NULL DEFAULT 0 CHECK (next_seq >= 0),  -- entries stored: seq first_seq..next_seq-1
    format     INTEGER NOT NULL DEFAULT 1,  -- run record format; a newer one is refused by load()
    created_at TEXT    NOT NULL,
    updated_at TEXT    NOT NULL,
    first_seq  INTEGER NOT NULL DEFAULT 0 CHECK (first_seq >= 0 AND first_seq <= next_seq),  -- trim() moves it up
    pinned     INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1))  -- runs.pin(): prune() leaves it
) STRICT;
-- runs.list() pages newest update first without reading the table.
CREATE INDEX run_by_update ON run (updated_at);

-- The append-only history of a run. The primary key makes a duplicate seq
-- impossible, and the triggers below make a gap impossible, whoever writes.
CREATE TABLE run_entry (
    run_id TEXT    NOT NULL REFERENCES run (id) ON DELETE CASCADE,
    seq    INTEGER NOT NULL CHECK (seq >= 0),
    entry  TEXT    NOT NULL,  -- JSON object, including its own "seq"
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;

-- The tool calls of a run by call id (SPEC §14: once() finds a call's newest
-- tool_call or tool_result with one probe, whatever the run's length). Partial:
-- only those entries are indexed. A query must repeat both expressions as written.
-- json_valid(...) first: an entry changed by hand into something that is not JSON
-- is still stored (and check() and load() say it is damaged), not refused here.
CREATE INDEX run_entry_call
ON run_entry (run_id, CASE WHEN json_valid(entry) THEN json_extract(entry, '$.call_id') END)
WHERE CASE WHEN json_valid(entry) THEN json_extract(entry, '$.type') END IN ('tool_call', 'tool_result');

-- The newest tool_call or tool_result entry of each call id (a string) that trim()
-- took out of a run's history: a call's claim and outcome outlive a trim (SPEC §16),
-- so once() after a trim never runs the call again. once() looks here when the
-- entries kept no longer hold the call.
CREATE TABLE run_call (
    run_id  TEXT    NOT NULL REFERENCES run (id) ON DELETE CASCADE,
    call_id TEXT    NOT NULL,
    seq     INTEGER NOT NULL,
    entry   TEXT    NOT NULL,  -- the entry as it was stored
    PRIMARY KEY (run_id, call_id)
) STRICT, WITHOUT ROWID;

-- No gap, whoever writes: an entry needs its predecessor, except the first
-- one kept (seq first_seq: 0, or where trim() cut the history).
-- (write() also keeps run.next_seq, and check() verifies the two agree.)
CREATE TRIGGER run_entry_contiguous BEFORE INSERT ON run_entry
WHEN NEW.seq < (SELECT first_seq FROM run WHERE id = NEW.run_id)
  OR (NEW.seq > (SELECT first_seq FROM run WHERE id = NEW.run_id)
      AND NOT EXISTS (SELECT 1 FROM run_entry WHERE run_id = NEW.run_id AND seq = NEW.seq - 1))
BEGIN
    SELECT RAISE(ABORT, 'history gap: seq must follow the last stored entry');
END;

-- Sessions, owned by the principal (by name) that created them.
CREATE TABLE session (
    id         TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    created_at TEXT NOT NULL,
    metadata   TEXT NOT NULL DEFAULT '{}'  -- JSON object
) STRICT;
CREATE INDEX session_by_owner ON session (owner, created_at);
CREATE INDEX session_by_time ON session (created_at, id);  -- an admin's sessions.list() pages

-- Turns of a session. status follows queued -> running -> finished | failed;
-- running -> held -> decided -> resuming -> finished | failed; a queued or
-- running turn whose lease lapsed becomes 'expired'.
CREATE TABLE turn (
    id          TEXT    PRIMARY KEY,
    session_id  TEXT    NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    n           INTEGER NOT NULL,  -- 1, 2, ... within the session: newest first sorts by it
    status      TEXT    NOT NULL CHECK (status IN ('queued', 'running', 'held', 'decided',
                                                   'resuming', 'finished', 'failed', 'expired')),
    input       TEXT,   -- JSON
    request     TEXT,   -- JSON, set by hold()
    decision    TEXT,   -- JSON, set by decide()
    result      TEXT,   -- JSON, set by finish()
    error       TEXT,   -- plain text, set by fail()
    lease       REAL,   -- seconds a lease lasts; heartbeat() renews by this much
    lease_until REAL,   -- unix time; a queued/running/resuming turn past it is expired
    created_at  TEXT    NOT NULL,
    updated_at  TEXT    NOT NULL,
    UNIQUE (session_id, n)
) STRICT;

-- One turn at a time, across processes: at most one queued or running turn
-- per session. start_turn expires lapsed leases first, in the same transaction.
CREATE UNIQUE INDEX turn_one_active ON turn (session_id) WHERE status IN ('queued', 'running');

-- sessions.turns_by_status(): the turns that block, may still act or lost their
-- lease, newest first; finished and failed ones (the bulk) stay out of the index.
CREATE INDEX turn_by_status ON turn (status, created_at)
WHERE status IN ('queued', 'running', 'held', 'decided', 'resuming', 'expired');

-- The change feed (SPEC §9): one row per committed change, written in the
-- same transaction as the change. Writers take turns (one write lock), so
-- seqs commit in order and a reader never sees a lower one appear later. Rows
-- hold no values; old rows are purged a few per write transaction, but never
-- the newest one, so max(seq) is never handed out again (no AUTOINCREMENT:
-- it would add a page to every commit). No index beyond seq: readers scan
-- forward from their cursor.
CREATE TABLE change (
    seq      INTEGER PRIMARY KEY,
    at       TEXT    NOT NULL,  -- commit time, ISO-8601 UTC
    topic    TEXT    NOT NULL CHECK (topic IN ('kv', 'run', 'session')),
    op       TEXT    NOT NULL,  -- kv: put delete append pop touch expire; run: create write delete fork trim pin;
                                -- session: create delete, or the turn's new status
    kind     TEXT,     -- kv: the scope kind
    scope_id TEXT,     -- kv: the scope id; run: the run id; session: the session id
    key      TEXT,     -- kv: the key; session: the turn id (NULL for the session itself)
    version  INTEGER,  -- kv: the key's version after the write (delete, expire: the last it had)
    start    INTEGER,  -- append/pop: first index; run: first seq; else NULL
    count    INTEGER   -- how many items or entries from start
) STRICT;

-- The store's own id (one row, made with the store): what tells two stores apart where
-- both are seen at once — the pages' sign-in cookie is named by it (SPEC §16), so two
-- stores served on one host do not share or clobber a sign-in.
CREATE TABLE store (
    id TEXT NOT NULL DEFAULT (lower(hex(randomblob(8))))
) STRICT;
INSERT INTO store DEFAULT VALUES;

-- Value history (SPEC §17): what each change of a key replaced or removed — the
-- key's state just before it, its before-image — keyed by that change's seq, kept
-- history_retention seconds (the bounded purge removes older ones, and moves
-- history_head.floor). A change that created the key has none: the key was absent
-- before it. The state of a key right after change S is the before-image of its
-- first change after S, or (no change since) its row in kv. A list's before-image is
-- its list and length: its items stay in list_item, and once popped in list_gone,
-- so no write copies a list.
CREATE TABLE kv_history (
    seq        INTEGER PRIMARY KEY,  -- the change (change.seq) that replaced this state
    version    INTEGER NOT NULL,
    type       TEXT    NOT NULL,
    value      ANY,      -- as in kv
    list_id    INTEGER,  -- a list: its items as they were (list_item, list_gone, list_base)
    length     INTEGER,
    size       INTEGER NOT NULL,
    updated_at TEXT    NOT NULL,
    expires_at REAL
) STRICT;
CREATE INDEX kv_history_list ON kv_history (list_id) WHERE list_id IS NOT NULL;

-- A key's changes in order: where its past is found (the first change after a seq).
CREATE INDEX change_by_key ON change (kind, scope_id, key, seq) WHERE topic = 'kv';

-- Items a pop removed, by the pop's seq: what a past state of the list still reads at
-- that index, for as long as the history is kept.
CREATE TABLE list_gone (
    list_id INTEGER NOT NULL,
    idx     INTEGER NOT NULL,
    seq     INTEGER NOT NULL,  -- the pop's change
    item    TEXT    NOT NULL,
    PRIMARY KEY (list_id, idx, seq)
) STRICT, WITHOUT ROWID;
CREATE INDEX list_gone_seq ON list_gone (seq);  -- the purge goes through them in seq order

-- Lists made from another list as it was (a fork's, a restore's: SPEC §17): below
-- base_len an index reads the base list, unless this list has an item of its own there.
-- So a fork costs the same whatever the list's length, and a write to either list never
-- changes the other: a pop of the base first gives each such list its own copy of the
-- items it removes. Their ids are negative (list_seq's are positive): a read of the
-- present tells them apart at once.
CREATE TABLE list_base (
    list_id  INTEGER PRIMARY KEY CHECK (list_id < 0),
    base_id  INTEGER NOT NULL,
    base_len INTEGER NOT NULL CHECK (base_len >= 0)
) STRICT;
CREATE INDEX list_base_of ON list_base (base_id);

-- Lists that may have lost their last reader (no key, kept state or list made from them
-- refers to them any more): the purge checks each and empties the dead ones, a few
-- items per write.
CREATE TABLE list_dead (list_id INTEGER PRIMARY KEY) STRICT;

-- How far back the history is complete (one row): every change after floor has its
-- before-image kept. The purge moves it on; turning history on sets it to the head.
CREATE TABLE history_head (floor INTEGER NOT NULL CHECK (floor >= 0)) STRICT;
INSERT INTO history_head VALUES (0);

-- Settings every process of the file agrees on (SPEC §10); absent: the default.
CREATE TABLE setting (
    name  TEXT PRIMARY KEY,
    value ANY  NOT NULL
) STRICT;

-- Tokens of the HTTP API (SPEC §12). Only a hash is kept: the token itself is
-- shown once, when made. A principal (name) may hold several; revoking the
-- name ends them all.
CREATE TABLE token (
    hash       TEXT    PRIMARY KEY,  -- sha256 of the token, hex
    name       TEXT    NOT NULL,     -- the principal it acts as
    admin      INTEGER NOT NULL CHECK (admin IN (0, 1)),
    created_at TEXT    NOT NULL,
    grants     TEXT,   -- SPEC §15: a JSON array of rules ("thread:t-1=rw"); NULL: no grants
    expires_at REAL    -- unix time from which the token is unknown; NULL: never
) STRICT, WITHOUT ROWID;
CREATE INDEX token_by_name ON token (name);

-- Sign-ins of the pages at /ui (SPEC §15), kept here so that every server of
-- the store knows them. Only a hash of the sign-in id (the browser's cookie)
-- is kept. A sign-in ends at sign-out, when expires_at passes (each use moves
-- it on, now and then), and with its token: revoking it deletes the row.
CREATE TABLE signin (
    hash       TEXT PRIMARY KEY,  -- sha256 of the sign-in id, hex
    token      TEXT NOT NULL REFERENCES token (hash) ON DELETE CASCADE,
    expires_at REAL NOT NULL      -- unix time
) STRICT, WITHOUT ROWID;
CREATE INDEX signin_by_token ON signin (token);
CREATE INDEX signin_expiry ON signin (expires_at);

-- Views for people using the sqlite3 shell.

-- Every live key with its scope, value and version (expired keys left out).
CREATE VIEW state AS
SELECT kind, scope_id, key,
       CASE type WHEN 'list' THEN (SELECT json_group_array(json(item))
                                   FROM (SELECT item FROM list_item WHERE list_id = kv.list_id ORDER BY idx))
                 WHEN 'bytes' THEN CAST(value AS TEXT)
                 ELSE value END AS value,
       type, version, length, size, updated_at,
       strftime('%Y-%m-%dT%H:%M:%SZ', expires_at, 'unixepoch') AS expires_at
FROM kv
WHERE expires_at IS NULL OR expires_at > (julianday('now') - 2440587.5) * 86400.0;

-- Every history entry of every run, in order.
CREATE VIEW run_history AS
SELECT run_id, seq, json_extract(entry, '$.type') AS type, entry
FROM run_entry;

-- Runs with their snapshot's summary fields.
CREATE VIEW runs AS
SELECT id, json_extract(snapshot, '$.task') AS task, json_extract(snapshot, '$.turn') AS turn,
       json_extract(snapshot, '$.finished') AS finished, next_seq - first_seq AS entries,
       first_seq, pinned, created_at, updated_at
FROM run;

-- Turns that block or may still act: queued, running, held, decided, resuming.
CREATE VIEW active_turns AS
SELECT t.session_id, s.owner, t.id AS turn_id, t.n, t.status,
       strftime('%Y-%m-%dT%H:%M:%SZ', t.lease_until, 'unixepoch') AS lease_until,
       t.lease_until < (julianday('now') - 2440587.5) * 86400.0 AS lease_lapsed, t.updated_at
FROM turn t JOIN session s ON s.id = t.session_id
WHERE t.status IN ('queued', 'running', 'held', 'decided', 'resuming');

-- The change feed, as SPEC §9 names its columns.
CREATE VIEW changes AS
SELECT seq, at, topic, op, kind, scope_id, key, version, start, count FROM change;

PRAGMA user_version = 6;
