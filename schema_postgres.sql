-- agentstate schema for PostgreSQL: the one and only copy. The package applies
-- this file to a new store in one transaction, under an advisory lock; the
-- agentstate_version row (last statement) is the schema version that
-- migrations compare against. The same store as schema.sql, table for table.
--
-- Every object is created in the connection's current schema (the first
-- schema of search_path), so `?options=-csearch_path%3Dname` in the URL keeps
-- stores apart in one database. Functions name tables without a schema: they
-- run with the caller's search_path, which is the store's.
--
-- Conventions: values are `json` (the text exactly as given: never jsonb,
-- which reorders keys and turns 1e16 into an integer); bytes are bytea; times
-- are timestamptz from the server's clock; keys and ids sort bytewise
-- (COLLATE "C"), as on SQLite. Every write is one statement: the common
-- writes of keys are single data-modifying statements that the client
-- prepares (agentstate/backends/postgres/lean.py), the rest one call of a
-- function below; they lock rows (SELECT ... FOR UPDATE, ON CONFLICT), never
-- tables, and no row or lock is shared by all writers: writers of different
-- keys, runs and sessions commit side by side. (The change feed's order is settled by its readers: see
-- feed_sequence. What writers do share is held for a moment, never through
-- a COMMIT: a sequence's next value, and the NOTIFY sent after the COMMIT.)
--
-- Refusals raise SQLSTATE P0001 with HINT 'agentstate:<error class>' (VersionConflict,
-- HistoryGap, ...) and, where the error carries a fact (a version, a turn id, a
-- size), that fact in DETAIL; the client raises that error.

-- The schema version of this store (one row).
CREATE TABLE agentstate_version (
    version integer NOT NULL
);
CREATE UNIQUE INDEX agentstate_version_one ON agentstate_version ((true));

-- Keys of scoped state: one row per (kind, scope_id, key) ever written or read
-- absent inside a transaction. A deleted key (or an expired one, once purged)
-- keeps its row as a tombstone: expires_at '-infinity' (so absent to every
-- reader's test of a live row), no value, and the version its next write
-- continues from (the last one + 1, as the delete consumed one): so a write
-- that creates a key is one statement (INSERT ... ON CONFLICT DO UPDATE, which
-- goes on from the latest committed row, whoever deleted or created it
-- meanwhile), and a stale if_version never matches a re-created key. A read
-- inside a transaction that finds no row inserts one (a tombstone of version
-- 0) and locks it (kv_read_lock): a writer that would create the key waits on
-- that row. A tombstone of a list keeps its list_id (its items are gone).
--
-- No CHECK constraints: what they would hold (SPEC §2's kinds, types,
-- versions and sizes) is validated by the client before it sends a write,
-- and PostgreSQL would rebuild a CHECK's expression for every statement that
-- writes the table (about as much server time as the write itself); db.check()
-- verifies the rows instead (admin.py).
CREATE TABLE kv (
    kind       text COLLATE "C" NOT NULL,  -- thread, session, agent, user, app
    scope_id   text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    version    bigint  NOT NULL,  -- >= 1, +1 on every write of the key (a tombstone: see above)
    type       text    NOT NULL,  -- json, bytes, list
    value      json,     -- json: the value's JSON text
    data       bytea,    -- bytes: the bytes
    list_id    bigint,   -- list: the list_id of its items (list_item)
    length     bigint,   -- list: number of items
    size       integer NOT NULL,  -- bytes of the compact JSON (a list: of the whole list)
    updated_at timestamptz NOT NULL,
    expires_at timestamptz,  -- from then on the key is absent to every reader; NULL: never
    PRIMARY KEY (kind, scope_id, key)
);
CREATE UNIQUE INDEX kv_list ON kv (list_id) WHERE list_id IS NOT NULL;
-- The keys with an expiry, soonest first (tombstones left out): the purge's probe.
CREATE INDEX kv_expiry ON kv (expires_at) WHERE expires_at > '-infinity';

-- Items of list values, one row per item, idx 0..length-1: an append writes
-- only the new items, a slice reads only what it returns.
CREATE TABLE list_item (
    list_id bigint NOT NULL,
    idx     bigint NOT NULL CHECK (idx >= 0),
    item    json   NOT NULL,  -- JSON text of one item
    PRIMARY KEY (list_id, idx)
);
CREATE SEQUENCE list_seq;  -- a new list takes the next list_id

-- Agent runs: one row per run, holding the replaceable snapshot. A run write
-- locks this row, so two writers of one run take turns.
CREATE TABLE run (
    id         text COLLATE "C" PRIMARY KEY,
    snapshot   json,                -- a JSON object, or NULL before the first one
    next_seq   bigint  NOT NULL DEFAULT 0 CHECK (next_seq >= 0),  -- entries: first_seq..next_seq-1
    format     integer NOT NULL DEFAULT 1,  -- run record format; a newer one is refused by load()
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    first_seq  bigint  NOT NULL DEFAULT 0,  -- trim() moves it up
    pinned     boolean NOT NULL DEFAULT false,  -- runs.pin(): prune() leaves it
    CHECK (first_seq >= 0 AND first_seq <= next_seq)
);
-- runs.list() pages newest update first without reading the table.
CREATE INDEX run_by_update ON run (updated_at, id);

-- The append-only history of a run: the primary key makes a duplicate seq
-- impossible and the trigger below a gap, whoever writes.
CREATE TABLE run_entry (
    run_id text COLLATE "C" NOT NULL REFERENCES run (id) ON DELETE CASCADE,
    seq    bigint NOT NULL CHECK (seq >= 0),
    entry  json   NOT NULL,  -- a JSON object, including its own "seq"
    PRIMARY KEY (run_id, seq)
);

-- No gap, whoever writes: every inserted entry needs its predecessor, except
-- the first one kept (seq first_seq: 0, or where trim() cut the history).
-- Once per statement, over the statement's new rows.
CREATE FUNCTION run_entry_contiguous() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM new_entries n JOIN run r ON r.id = n.run_id
        WHERE n.seq < r.first_seq
           OR (n.seq > r.first_seq AND NOT EXISTS (
                   SELECT 1 FROM run_entry e WHERE e.run_id = n.run_id AND e.seq = n.seq - 1)))
    THEN
        RAISE EXCEPTION 'history gap: seq must follow the last stored entry'
            USING ERRCODE = 'integrity_constraint_violation', HINT = 'agentstate:HistoryGap';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER run_entry_contiguous AFTER INSERT ON run_entry
    REFERENCING NEW TABLE AS new_entries FOR EACH STATEMENT EXECUTE FUNCTION run_entry_contiguous();

-- The tool calls of a run by call id (SPEC §14: once() finds a call's newest
-- tool_call or tool_result with one probe, whatever the run's length). Partial:
-- only those entries are indexed; a query repeats both expressions as written.
CREATE INDEX run_entry_call ON run_entry (run_id, (entry ->> 'call_id'), seq)
WHERE (entry ->> 'type') IN ('tool_call', 'tool_result');

-- The newest tool_call or tool_result entry of each call id (a string) that trim()
-- took out of a run's history: a call's claim and outcome outlive a trim (SPEC §16),
-- so once() after a trim never runs the call again. once() looks here when the
-- entries kept no longer hold the call.
CREATE TABLE run_call (
    run_id  text COLLATE "C" NOT NULL REFERENCES run (id) ON DELETE CASCADE,
    call_id text COLLATE "C" NOT NULL,
    seq     bigint NOT NULL,
    entry   json   NOT NULL,  -- the entry as it was stored
    PRIMARY KEY (run_id, call_id)
);

-- Sessions, owned by the principal (by name) that created them.
CREATE TABLE session (
    id         text COLLATE "C" PRIMARY KEY,
    owner      text COLLATE "C" NOT NULL,
    created_at timestamptz NOT NULL,
    metadata   json NOT NULL DEFAULT '{}'  -- a JSON object
);
CREATE INDEX session_by_owner ON session (owner, created_at);
CREATE INDEX session_by_time ON session (created_at, id);  -- an admin's sessions.list() pages

-- Turns of a session: queued -> running -> finished | failed; running -> held
-- -> decided -> resuming -> finished | failed; a queued, running or resuming
-- turn whose lease lapsed becomes 'expired'.
CREATE TABLE turn (
    id          text COLLATE "C" PRIMARY KEY,
    session_id  text COLLATE "C" NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    n           bigint NOT NULL,  -- 1, 2, ... within the session
    status      text   NOT NULL CHECK (status IN ('queued', 'running', 'held', 'decided',
                                                  'resuming', 'finished', 'failed', 'expired')),
    input       json,
    request     json,  -- set by hold()
    decision    json,  -- set by decide()
    result      json,  -- set by finish()
    error       text,  -- set by fail()
    lease       double precision,  -- seconds a lease lasts; heartbeat() renews by this much
    lease_until timestamptz,       -- a queued/running/resuming turn past it is expired
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    UNIQUE (session_id, n)
);

-- One turn at a time, across machines: at most one queued or running turn per session.
CREATE UNIQUE INDEX turn_one_active ON turn (session_id) WHERE status IN ('queued', 'running');

-- sessions.turns_by_status(): the turns that block, may still act or lost their
-- lease, newest first; finished and failed ones (the bulk) stay out of the index.
CREATE INDEX turn_by_status ON turn (status, created_at)
WHERE status IN ('queued', 'running', 'held', 'decided', 'resuming', 'expired');

-- The change feed (SPEC §9): one row per committed change, in commit order,
-- numbered. A write does not number its changes (that would make every writer
-- wait for the one before it to commit: a global lock): it adds them to
-- change_new, with a ticket from a sequence taken as its last step, and
-- commits. A reader, before it reads, numbers the committed ones
-- (feed_sequence, one at a time, under an advisory lock, in a
-- transaction of its own that commits durably) and moves them here. So seqs
-- become visible only in increasing order, and only for committed changes: a
-- reader that has seen seq N never later finds a change <= N appear. (A
-- plain sequence does not promise that: a later number can commit first.)
-- Rows hold no values; old rows are purged a few per write.
CREATE TABLE change (
    seq      bigint PRIMARY KEY,
    at       timestamptz NOT NULL,  -- when it was written (its transaction's last step)
    topic    text NOT NULL CHECK (topic IN ('kv', 'run', 'session')),
    op       text NOT NULL,  -- kv: put delete append pop touch expire; run: create write delete fork
                             -- trim; session: create delete, or the turn's new status
    kind     text COLLATE "C",  -- kv: the scope kind
    scope_id text COLLATE "C",  -- kv: the scope id; run: the run id; session: the session id
    key      text COLLATE "C",  -- kv: the key; session: the turn id (NULL for the session itself)
    version  bigint,  -- kv: the key's version after the write (delete, expire: the last it had)
    start    bigint,  -- append/pop: first index; run: first seq; else NULL
    count    bigint,  -- how many items or entries from start
    id       bigint   -- kv, while history is on: the change's id (its before-image's, kv_history)
);
-- A key's changes in order (SPEC §17: the first change of a key after a seq, a key's
-- revisions), and a change by its id (whether a popped item went after a seq).
CREATE INDEX change_by_key ON change (kind, scope_id, key, seq) WHERE topic = 'kv';
CREATE UNIQUE INDEX change_by_id ON change (id) WHERE id IS NOT NULL;

-- The newest seq handed out: never handed out again, even once purged.
-- Written only by the sequencers (feed_number), never by a writer.
CREATE TABLE feed_head (
    last  bigint NOT NULL CHECK (last >= 0),
    at    timestamptz NOT NULL DEFAULT '-infinity',  -- when feed_number last numbered something
    fence xid8 NOT NULL DEFAULT '0'  -- every change of a transaction below it is numbered (or void)
);
CREATE UNIQUE INDEX feed_head_one ON feed_head ((true));
INSERT INTO feed_head (last) VALUES (0);

-- Committed changes not numbered yet (and, until their commit, a writer's own).
-- ticket: nextval('change_ticket'), taken by the statement that adds a
-- transaction's changes, after everything the transaction read or waited
-- for (a transaction() block's changes get theirs at its end: feed_close;
-- until then it is NULL, and ord is a nextval of the same sequence, in the
-- order they were made); ord: their order within it. feed_sequence numbers
-- them in (ticket, ord) order: if a transaction B saw the commit of A (it
-- waited for A's row lock, or read what A wrote), A took its ticket before
-- its commit and B after it, so A's changes come first; a transaction's
-- changes get consecutive seqs. xid: the writer's transaction. Readers look
-- here before every read (index scan from feed_head.fence), so what they
-- scan is what came since the last numbering, not the dead rows of earlier
-- ones (which only VACUUM removes).
CREATE TABLE change_new (
    xid      xid8    NOT NULL,
    ticket   bigint,
    ord      bigint  NOT NULL,
    at       timestamptz NOT NULL,
    topic    text NOT NULL,
    op       text NOT NULL,
    kind     text COLLATE "C",
    scope_id text COLLATE "C",
    key      text COLLATE "C",
    version  bigint,
    start    bigint,
    count    bigint,
    id       bigint  -- as change.id
);
CREATE INDEX change_new_xid ON change_new (xid);
CREATE SEQUENCE change_ticket;

-- Whether anyone watches the feed: the time (unix seconds, the server's clock)
-- until which a watcher has said it listens (feed_watch, renewed every few
-- seconds while it does). A write sends its wake-up (a NOTIFY, after its
-- COMMIT) only before that time. A sequence, read with pg_sequence_last_value:
-- unlike a table's row it is read as it is now, not as of the reader's
-- snapshot, so a write that reads it after taking its transaction id sees any
-- watcher that registered before that read (see waiter.py for the others).
CREATE SEQUENCE watch_lease;

-- Value history (SPEC §17). A kv change made while history is on has an id (a
-- sequence's next value, taken under the key's row lock, so a key's ids follow its
-- changes' order); the state it replaced (its before-image) is kept under that id in
-- the write's own statement or function. Changes are numbered only later (feed_number
-- copies the id), so the past is found through the feed: the state of a key right
-- after change S is the before-image of its first change after S (none: it was absent),
-- or its row now when it has not changed since. A change with no id was made while
-- history was off: what it replaced is unknown.
CREATE SEQUENCE change_id;

-- Before-images: a key's row as a change found it (live: a created key has none).
CREATE TABLE kv_history (
    change_id  bigint PRIMARY KEY,
    version    bigint NOT NULL,
    type       text   NOT NULL,
    value      json,
    data       bytea,
    list_id    bigint,  -- a list's items are not copied: its list, as long as length
    length     bigint,
    size       integer NOT NULL,
    updated_at timestamptz NOT NULL,
    expires_at timestamptz
);
CREATE INDEX kv_history_list ON kv_history (list_id) WHERE list_id IS NOT NULL;

-- Items a pop removed, while history is on: a past state of the list reads them.
CREATE TABLE list_gone (
    list_id   bigint NOT NULL,
    idx       bigint NOT NULL,
    change_id bigint NOT NULL,  -- the pop's
    item      json   NOT NULL,
    PRIMARY KEY (list_id, idx, change_id)
);
CREATE INDEX list_gone_change ON list_gone (change_id);

-- Lists made from another as it was (a restore's, a fork's: a negative list_id). Such a
-- list reads its base below base_len where it has no item of its own; a pop of the
-- base first copies what it removes into it (kv_pop), so what it reads never changes.
CREATE TABLE list_base (
    list_id  bigint PRIMARY KEY,
    base_id  bigint NOT NULL,
    base_len bigint NOT NULL
);
CREATE INDEX list_base_by_base ON list_base (base_id);

-- Lists that may have lost their last reader (key, before-image, list made from them):
-- the purge empties them a bounded amount at a time.
CREATE TABLE list_dead (
    list_id bigint PRIMARY KEY
);

-- How far back the past is known (one row): right after every change from floor on.
-- The purge drops what the changes up to floor kept, in seq order; done: how far it
-- got. The feed's purge never drops a change row above done (the purge finds what a
-- change kept through its row).
CREATE TABLE history_head (
    floor bigint NOT NULL,
    done  bigint NOT NULL
);
CREATE UNIQUE INDEX history_head_one ON history_head ((true));
INSERT INTO history_head VALUES (0, 0);

-- The store's own id (one row, made with the store): what tells two stores apart where
-- both are seen at once — the pages' sign-in cookie is named by it (SPEC §16), so two
-- stores served on one host do not share or clobber a sign-in.
CREATE TABLE store (
    id text NOT NULL DEFAULT substr(md5(random()::text || clock_timestamp()::text), 1, 16)
);
CREATE UNIQUE INDEX store_one ON store ((true));
INSERT INTO store DEFAULT VALUES;

-- Settings every client of the store agrees on (SPEC §10); absent: the default.
CREATE TABLE setting (
    name  text COLLATE "C" PRIMARY KEY,
    value bigint NOT NULL
);

-- Tokens of the HTTP API (SPEC §12). Only a hash is kept: the token itself is
-- shown once, when it is created.
CREATE TABLE token (
    hash       text COLLATE "C" PRIMARY KEY,  -- sha256 of the token, hex
    name       text COLLATE "C" NOT NULL,     -- the principal it acts as
    admin      boolean NOT NULL,
    created_at timestamptz NOT NULL,
    grants     text,        -- SPEC §15: a JSON array of rules ("thread:t-1=rw"); NULL: no grants
    expires_at timestamptz  -- from then on the token is unknown; NULL: never
);
CREATE INDEX token_by_name ON token (name);

-- Sign-ins of the pages at /ui (SPEC §15), kept here so that every server of
-- the store knows them. Only a hash of the sign-in id (the browser's cookie)
-- is kept. A sign-in ends at sign-out, when expires_at passes (each use moves
-- it on, now and then), and with its token: revoking it deletes the row.
CREATE TABLE signin (
    hash       text COLLATE "C" PRIMARY KEY,  -- sha256 of the sign-in id, hex
    token      text COLLATE "C" NOT NULL REFERENCES token (hash) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL
);
CREATE INDEX signin_by_token ON signin (token);
CREATE INDEX signin_expiry ON signin (expires_at);

-- One change, as the write functions collect them.
CREATE TYPE change_row AS (
    topic text, op text, kind text, scope_id text, key text, version bigint, start bigint, count bigint,
    id bigint  -- a kv change's id while history is on (history_id()), else NULL
);

-- Times as the store shows them: ISO-8601 UTC with microseconds and a Z.
CREATE FUNCTION iso_utc(t timestamptz) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- The NOTIFY channel of this store: watchers LISTEN on it (a wake-up only).
CREATE FUNCTION feed_channel() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT 'agentstate_' || substr(md5(current_schema()), 1, 20)
$$;

-- Refuse a write: the caller's statement (and its transaction, or savepoint) is rolled back.
CREATE FUNCTION agentstate_error(p_code text, p_message text, p_detail text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = p_message, HINT = 'agentstate:' || p_code,
                          DETAIL = coalesce(p_detail, '');
END $$;

-- Bytes as text for the state view: UTF-8 text as it is, anything else as \x hex.
CREATE FUNCTION bytes_text(b bytea) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN convert_from(b, 'UTF8');
EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
    RETURN '\x' || encode(b, 'hex');
END $$;

-- What each write done by a function below calls with its changes (the
-- prepared statements of lean.py write their change rows themselves, in the
-- same shape): into change_new, under one ticket taken now (the write's last
-- step), or, inside a transaction() block, with no ticket yet (feed_close
-- gives the block's changes one at its end) and their order kept in ord. No
-- lock: concurrent writers do not wait for each other here. Nothing when the
-- feed is off (feed_retention 0).
CREATE FUNCTION feed_add(ch change_row[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_ticket bigint;
BEGIN
    IF coalesce(cardinality(ch), 0) = 0
       OR EXISTS (SELECT 1 FROM setting WHERE name = 'feed_retention' AND value = 0) THEN
        RETURN;
    END IF;
    IF current_setting('agentstate.block', true) = 'on' THEN
        INSERT INTO change_new (xid, ticket, ord, at, topic, op, kind, scope_id, key, version, start, count, id)
        SELECT pg_current_xact_id(), NULL, nextval('change_ticket'), clock_timestamp(), u.topic, u.op, u.kind,
               u.scope_id, u.key, u.version, u.start, u.count, u.id
        FROM unnest(ch) WITH ORDINALITY AS u(topic, op, kind, scope_id, key, version, start, count, id, n)
        ORDER BY u.n;
        RETURN;
    END IF;
    v_ticket := nextval('change_ticket');
    INSERT INTO change_new (xid, ticket, ord, at, topic, op, kind, scope_id, key, version, start, count, id)
    SELECT pg_current_xact_id(), v_ticket, u.n, clock_timestamp(), u.topic, u.op, u.kind, u.scope_id, u.key,
           u.version, u.start, u.count, u.id
    FROM unnest(ch) WITH ORDINALITY AS u(topic, op, kind, scope_id, key, version, start, count, id, n);
END $$;

-- A transaction() block's last statement before its COMMIT: one ticket for all
-- its changes, taken after everything it read or waited for.
CREATE FUNCTION feed_close() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE change_new SET ticket = (SELECT nextval('change_ticket'))
    WHERE xid = pg_current_xact_id_if_assigned() AND ticket IS NULL;
END $$;

-- The sequencers' lock: one numbers a store's feed at a time. An advisory
-- lock (not feed_head's row lock), so that a sequencer that waited for
-- another and finds nothing left to number has written nothing: no
-- transaction id, no flush.
CREATE FUNCTION feed_lock_key() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT hashtextextended('agentstate:feed:' || current_schema(), 0)
$$;

-- Number the committed changes of change_new, in ticket order, from
-- feed_head.last on, and move them to `change`; the newest seq. Readers call
-- it before they read (in a transaction of its own: the read's snapshot
-- comes after its COMMIT), so a writer that committed and then reads sees
-- its change. With nothing to number it reads two rows and writes nothing (a
-- polling reader takes no lock and never waits for a flush). Else, one
-- sequencer at a time (feed_lock_key); the statements after the lock see
-- the previous sequencer's commit (READ COMMITTED: a new snapshot each), so
-- no change is numbered twice and the seqs continue where it stopped. Its
-- commit is durable (synchronous_commit on whatever the session's), so a seq
-- a reader has seen is never lost to a crash and handed out again. A client
-- that may not write (a read-only transaction or role, a standby) numbers
-- nothing and reads what the others numbered (writers number a feed nobody
-- numbers about once a second: feed_notify).
CREATE FUNCTION feed_sequence() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF NOT feed_pending()
       OR current_setting('transaction_read_only') = 'on' THEN  -- a read-only client (or a standby)
        RETURN (SELECT last FROM feed_head);  -- reads what others numbered
    END IF;
    BEGIN
        IF current_setting('synchronous_commit') = 'off' THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
        PERFORM pg_advisory_xact_lock(feed_lock_key());
        RETURN feed_number();
    EXCEPTION WHEN insufficient_privilege THEN  -- a role that may only read: as above
        RETURN (SELECT last FROM feed_head);
    END;
END $$;

-- Whether change_new may hold a committed change to number: an index scan
-- from the fence (the first xid at or above it), so it reads only what came
-- since the last numbering, not the dead rows VACUUM has yet to remove.
-- (PL/pgSQL: its plan is kept; a SQL function with a sub-select is planned
-- again on every call.)
CREATE FUNCTION feed_pending() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT xid FROM change_new WHERE xid >= (SELECT fence FROM feed_head) ORDER BY xid LIMIT 1)
           IS NOT NULL;
END $$;

-- The numbering itself, by the holder of the sequencers' lock (statements of
-- its own: they see every change committed before the lock was granted). The
-- new fence is the oldest transaction still running when it starts (taken
-- before the DELETE's snapshot): any transaction below it had ended by then,
-- so its changes, if it committed, are numbered now.
CREATE FUNCTION feed_number() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_fence xid8 := pg_snapshot_xmin(pg_current_snapshot());
    v_old   xid8;
    v_last  bigint;
    v_n     bigint;
BEGIN
    SELECT last, fence INTO v_last, v_old FROM feed_head;
    WITH moved AS (DELETE FROM change_new WHERE xid >= v_old RETURNING *)
    INSERT INTO change (seq, at, topic, op, kind, scope_id, key, version, start, count, id)
    SELECT v_last + row_number() OVER (ORDER BY ticket, ord), at, topic, op, kind, scope_id, key,
           version, start, count, id
    FROM moved;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN  -- else nothing is written (the fence waits for the next numbering)
        UPDATE feed_head SET last = v_last + v_n, at = clock_timestamp(), fence = greatest(fence, v_fence);
    END IF;
    RETURN v_last + v_n;
END $$;

-- Whether the feed has work for a writer to do after its COMMIT (the client
-- asks every 16th write: see feed_after): expired keys to purge, rows past the
-- retention, before-images past history's (SPEC §17) or lists to empty, or
-- changes nobody has numbered for a second (a feed nobody reads is numbered by
-- its writers, so that it is purged in time). Index probes in index order,
-- whatever the tables hold.
CREATE VIEW feed_due AS
SELECT coalesce((SELECT expires_at FROM kv WHERE expires_at > '-infinity' ORDER BY expires_at LIMIT 1)
                <= clock_timestamp(), false)
    OR coalesce((SELECT at FROM change ORDER BY seq LIMIT 1)
                < clock_timestamp() - coalesce((SELECT value FROM setting WHERE name = 'feed_retention'), 604800)
                                      * interval '1 second', false)
    OR coalesce((SELECT at FROM change WHERE seq > (SELECT floor FROM history_head) ORDER BY seq LIMIT 1)
                < clock_timestamp() - coalesce((SELECT value FROM setting WHERE name = 'history_retention'), 86400)
                                      * interval '1 second', false)
    OR (SELECT list_id FROM list_dead ORDER BY list_id LIMIT 1) IS NOT NULL
    OR coalesce((SELECT at FROM feed_head) < clock_timestamp() - interval '1 second'
                AND (SELECT xid FROM change_new WHERE xid >= (SELECT fence FROM feed_head) ORDER BY xid LIMIT 1)
                    IS NOT NULL, false) AS due;

-- Whether someone watches the feed now (see watch_lease).
CREATE VIEW feed_watched AS
SELECT coalesce(pg_sequence_last_value('watch_lease') >= extract(epoch FROM clock_timestamp()), false)
       AS watched;

-- What a write's client sends after its COMMIT, in a transaction of its own,
-- when the write told it that someone watches (p_notify) or that the feed has
-- work due (p_tidy): the wake-up, and the bounded purge (a few old feed rows
-- and expired keys: no write pays for a large one; rows another transaction
-- holds are skipped), after numbering the changes if no reader has for a
-- second (unless another client is numbering them: never waits, never fails).
-- Not inside the write: PostgreSQL holds a lock of the whole database from a
-- NOTIFY's commit until its flush is done, which would make every writer's
-- commit wait for the one before it. Here the commit is not flushed (nothing
-- to keep: a purge lost to a crash is done again), so that lock is held for
-- a moment; a numbering's commit is flushed, as feed_sequence's.
CREATE FUNCTION feed_after(p_notify boolean, p_tidy boolean) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_numbered boolean := false;
    v_purged   change_row[];
BEGIN
    IF p_tidy THEN
        IF feed_pending() AND EXISTS (SELECT 1 FROM feed_head WHERE at < clock_timestamp() - interval '1 second') THEN
            BEGIN
                IF pg_try_advisory_xact_lock(feed_lock_key()) THEN
                    PERFORM feed_number();
                    v_numbered := true;
                END IF;
            EXCEPTION WHEN OTHERS THEN
                NULL;  -- the write has committed: its numbering is left to the next reader
            END;
        END IF;
        SELECT o_changes INTO v_purged FROM feed_purge_step(64);
        PERFORM feed_add(v_purged);  -- numbered by the next reader, as a write's
    END IF;
    PERFORM set_config('synchronous_commit', CASE WHEN v_numbered THEN 'on' ELSE 'off' END, true);
    IF p_notify THEN
        PERFORM pg_notify(feed_channel(), '');
    END IF;
END $$;

-- Sent by the client right after the COMMIT of a write done by the functions
-- above (a transaction() block, a run's write, ...), in a transaction of its
-- own, in the same round trip: the wake-up if someone watches, and (p_tidy:
-- every 16th write of a client) the purge if it is due. Read after the COMMIT,
-- so a watcher that registered before it is woken.
CREATE FUNCTION feed_notify(p_tidy boolean) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_watched boolean := (SELECT watched FROM feed_watched);
    v_due     boolean := p_tidy AND (SELECT due FROM feed_due);
BEGIN
    IF v_watched OR v_due THEN
        PERFORM feed_after(v_watched, v_due);
    END IF;
END $$;

-- A watcher says it listens for p_seconds more (its client renews it every
-- few seconds while it does). Not flushed: a lease lost to a crash only costs
-- a wake-up that the watcher's look-again makes up for. With the rights of
-- the store's owner (and its search_path), so that a client that may only
-- read the store is woken too.
CREATE FUNCTION feed_watch(p_seconds integer) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_until bigint := extract(epoch FROM clock_timestamp())::bigint + p_seconds;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('agentstate:watch:' || current_schema(), 0));
    IF coalesce(pg_sequence_last_value('watch_lease'), 0) < v_until THEN
        PERFORM setval('watch_lease', v_until);
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
END $$;

-- Whether writes keep what they replace (SPEC §17): history and the feed both on.
CREATE FUNCTION history_on() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT FROM setting WHERE name IN ('history_retention', 'feed_retention') AND value = 0)
$$;

-- A kv change's id, taken once the key's row is locked: while history is on, a new
-- one (its before-image is kept under it); else NULL.
CREATE FUNCTION history_id() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN history_on() THEN nextval('change_id') END
$$;

-- Keep r (a live row a change replaced or removed) as change p_id's before-image.
CREATE FUNCTION kv_keep(p_id bigint, r kv) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_id IS NOT NULL THEN
        INSERT INTO kv_history (change_id, version, type, value, data, list_id, length, size, updated_at,
                                expires_at)
        VALUES (p_id, r.version, r.type, r.value, r.data, r.list_id, r.length, r.size, r.updated_at,
                r.expires_at);
    END IF;
END $$;

-- Empty a list now: its items, its popped items, its base row (its base, which may have
-- lost its last reader, is queued for the purge).
CREATE FUNCTION list_drop(p_list bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_base bigint;
BEGIN
    DELETE FROM list_item WHERE list_id = p_list;
    DELETE FROM list_gone WHERE list_id = p_list;
    DELETE FROM list_base WHERE list_id = p_list RETURNING base_id INTO v_base;
    IF v_base IS NOT NULL THEN
        INSERT INTO list_dead VALUES (v_base) ON CONFLICT DO NOTHING;
    END IF;
END $$;

-- A list stopped being its key's value (replaced, deleted, expired). Kept in a
-- before-image (p_kept), or read by a list made from it: its items stay (the purge
-- empties it once nothing reads it). Else they go now, as before history.
CREATE FUNCTION list_release(p_list bigint, p_kept boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_kept OR EXISTS (SELECT FROM list_base WHERE base_id = p_list) THEN
        RETURN;
    END IF;
    PERFORM list_drop(p_list);
END $$;

-- The items of a list at p_start..p_stop-1 as it is now, (idx, item text): its own
-- item at each index, else (a list made from another) its base's, below the base's
-- length. An index is missing only when the store is damaged (callers check).
CREATE FUNCTION list_rows(p_list bigint, p_start bigint, p_stop bigint) RETURNS TABLE (idx bigint, item text)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE chain (list_id, lim, depth) AS (
        SELECT p_list, p_stop, 0
        UNION ALL
        SELECT b.base_id, least(ch.lim, b.base_len), ch.depth + 1
        FROM chain ch JOIN list_base b ON b.list_id = ch.list_id)
    -- Each list of the chain by its own range of the primary key (OFFSET 0 keeps the
    -- subquery from being joined whole: the planner, guessing ~100 lists in the chain,
    -- chose to scan every list's items, whatever the table holds, for a pop of one).
    SELECT DISTINCT ON (i.idx) i.idx, i.item::text
    FROM chain ch CROSS JOIN LATERAL (
        SELECT li.idx, li.item FROM list_item li
        WHERE li.list_id = ch.list_id AND li.idx >= p_start AND li.idx < ch.lim OFFSET 0) i
    ORDER BY i.idx, ch.depth
$$;

-- The same item texts, in order, as an array.
CREATE FUNCTION list_read(p_list bigint, p_start bigint, p_stop bigint) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(item ORDER BY idx), '{}') FROM list_rows(p_list, p_start, p_stop)
$$;

-- A new list (its negative id) that reads p_base as it was right after change p_seq
-- (NULL: as it is now), below p_len (a fork's or a restore's): nothing is copied but what a pop of the base
-- removed since then (the earliest such item of each index). The purge of dead lists
-- takes the same lock, so the base is not emptied under it; refused if it was.
CREATE FUNCTION list_based(p_base bigint, p_len bigint, p_seq bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_list bigint := -nextval('list_seq');
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('agentstate:list:' || current_schema(), p_base));
    IF NOT (EXISTS (SELECT FROM kv WHERE list_id = p_base) OR EXISTS (SELECT FROM kv_history WHERE list_id = p_base)
            OR EXISTS (SELECT FROM list_base WHERE base_id = p_base)) THEN
        PERFORM agentstate_error('CursorExpired',
            format('the history kept no longer reaches change %s: the list was purged meanwhile', p_seq));
    END IF;
    INSERT INTO list_base (list_id, base_id, base_len) VALUES (v_list, p_base, p_len);
    INSERT INTO list_item (list_id, idx, item)
    SELECT DISTINCT ON (g.idx) v_list, g.idx, g.item FROM list_gone g
    WHERE g.list_id = p_base AND g.idx < p_len AND p_seq IS NOT NULL  -- (NULL: as it is now)
      AND NOT EXISTS (SELECT FROM change c WHERE c.id = g.change_id AND c.seq <= p_seq)
    ORDER BY g.idx, g.change_id;
    RETURN v_list;
END $$;

-- Make a key's row a tombstone (see kv); its change. What it removed is kept (history
-- on: a list's items stay for it), else a list's items go.
CREATE FUNCTION kv_remove(r kv, p_op text) RETURNS change_row LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := history_id();
BEGIN
    IF r.type = 'list' THEN
        PERFORM list_release(r.list_id, v_id IS NOT NULL);
    END IF;
    UPDATE kv SET version = r.version + 1, expires_at = '-infinity', value = NULL, data = NULL, list_id = NULL,
                  length = NULL, size = 0, updated_at = clock_timestamp()
    WHERE kind = r.kind AND scope_id = r.scope_id AND key = r.key;
    PERFORM kv_keep(v_id, r);
    RETURN ROW('kv', p_op, r.kind, r.scope_id, r.key, r.version, NULL, NULL, v_id)::change_row;
END $$;

-- What a read inside a write transaction takes before it reads (the read
-- itself is the next statement, with a snapshot taken after this one's
-- waits): the lock of the key's row, whatever it holds, or of a tombstone of
-- version 0 inserted for a key that has no row; every write of a key locks
-- its row first, a creation included (ON CONFLICT), so what the read finds (a
-- value, or nothing) stays true until the transaction ends. (ON CONFLICT DO
-- UPDATE locks the row it meets even when its WHERE then updates nothing.)
CREATE FUNCTION kv_read_lock(p_kind text, p_sid text, p_key text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO kv AS t (kind, scope_id, key, version, type, size, updated_at, expires_at)
    VALUES (p_kind, p_sid, p_key, 0, 'json', 0, clock_timestamp(), '-infinity')
    ON CONFLICT (kind, scope_id, key) DO UPDATE SET version = t.version WHERE false;
END $$;

-- Write a value (p_items: a list's item texts; p_list: a list made from another,
-- list_based's, of p_length items, instead); the new version. The writes that
-- lean.py's statements cannot do (a list value, an expired row, a refusal with its
-- precise error), and every put inside a transaction() block.
-- p_ttl: seconds from the write, or NULL (never); p_keep: keep the key's expiry.
-- Times are the write's own (clock_timestamp() once the row is locked), not
-- its transaction's start: a write late in a long transaction() block
-- expires p_ttl seconds after it, and sees a key that expired meanwhile as absent.
CREATE FUNCTION kv_put(p_kind text, p_sid text, p_key text, p_type text, p_value json, p_data bytea,
                       p_size bigint, p_items text[], p_if_version bigint, p_ttl double precision,
                       p_keep boolean, p_list bigint DEFAULT NULL, p_length bigint DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz;
    v_expires timestamptz;
    v_version bigint;
    v_list    bigint;
    v_length  bigint;
    v_found   boolean;
    v_live    boolean;
    v_id      bigint;
    r         kv;
    ch        change_row[] := '{}';
BEGIN
    IF p_items IS NULL AND p_list IS NULL AND p_if_version IS DISTINCT FROM 0 AND NOT history_on() THEN
        -- A live key that is not a list, nothing to keep: one statement (clock_timestamp()
        -- is read for the row once it is locked, after any wait).
        UPDATE kv SET version = version + 1, type = p_type, value = p_value, data = p_data, size = p_size,
                      updated_at = clock_timestamp(),
                      expires_at = CASE WHEN p_keep THEN expires_at
                                        ELSE clock_timestamp() + p_ttl * interval '1 second' END
        WHERE kind = p_kind AND scope_id = p_sid AND key = p_key
          AND (p_if_version IS NULL OR version = p_if_version)
          AND type <> 'list' AND (expires_at IS NULL OR expires_at > clock_timestamp())
        RETURNING version INTO v_version;
        IF v_version IS NOT NULL THEN
            PERFORM feed_add(ARRAY[ROW('kv', 'put', p_kind, p_sid, p_key, v_version, NULL, NULL, NULL)::change_row]);
            RETURN v_version;
        END IF;
    END IF;
    LOOP  -- again when another writer created the key meanwhile
        SELECT * INTO r FROM kv WHERE kind = p_kind AND scope_id = p_sid AND key = p_key FOR UPDATE;
        v_found := FOUND;
        v_now := clock_timestamp();
        v_live := v_found AND (r.expires_at IS NULL OR r.expires_at > v_now);
        IF v_found AND NOT v_live AND r.expires_at > '-infinity' THEN  -- expired: a tombstone first
            ch := ch || kv_remove(r, 'expire');
            r.version := r.version + 1;
        END IF;
        IF p_if_version IS NOT NULL AND p_if_version <> (CASE WHEN v_live THEN r.version ELSE 0 END) THEN
            PERFORM agentstate_error('VersionConflict',
                format('put %s:%s %s: expected version %s, the current version is %s',
                       p_kind, p_sid, p_key, p_if_version, CASE WHEN v_live THEN r.version ELSE 0 END),
                (CASE WHEN v_live THEN r.version ELSE 0 END)::text);
        END IF;
        v_id := history_id();
        v_expires := CASE WHEN NOT p_keep THEN v_now + p_ttl * interval '1 second'
                          WHEN v_live THEN r.expires_at END;
        IF v_live AND r.type = 'list' THEN  -- its items go, or stay for what it was
            PERFORM list_release(r.list_id, v_id IS NOT NULL);
        END IF;
        v_list := p_list;
        v_length := p_length;
        IF p_items IS NOT NULL THEN
            v_length := cardinality(p_items);
            v_list := nextval('list_seq');  -- a new list: the one replaced may be kept
        END IF;
        IF NOT v_found THEN
            INSERT INTO kv (kind, scope_id, key, version, type, value, data, list_id, length, size,
                            updated_at, expires_at)
            VALUES (p_kind, p_sid, p_key, 1, p_type, p_value, p_data, v_list, v_length, p_size, v_now, v_expires)
            ON CONFLICT (kind, scope_id, key) DO NOTHING
            RETURNING version INTO v_version;
            CONTINUE WHEN v_version IS NULL;  -- another writer's row: lock it, and look again
        ELSE
            v_version := r.version + 1;
            UPDATE kv SET version = v_version, type = p_type, value = p_value, data = p_data,
                          list_id = v_list, length = v_length, size = p_size, updated_at = v_now,
                          expires_at = v_expires
            WHERE kind = p_kind AND scope_id = p_sid AND key = p_key;
        END IF;
        IF p_items IS NOT NULL THEN
            INSERT INTO list_item (list_id, idx, item)
            SELECT v_list, u.ord - 1, u.item::json FROM unnest(p_items) WITH ORDINALITY AS u(item, ord);
        END IF;
        IF v_live THEN
            PERFORM kv_keep(v_id, r);
        END IF;
        ch := ch || ROW('kv', 'put', p_kind, p_sid, p_key, v_version,
                        CASE WHEN v_list IS NOT NULL THEN 0 END, v_length, v_id)::change_row;
        PERFORM feed_add(ch);
        RETURN v_version;
    END LOOP;
END $$;

-- Remove a key (a tombstone; a list's items deleted); whether it existed.
CREATE FUNCTION kv_delete(p_kind text, p_sid text, p_key text, p_if_version bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    r       kv;
    v_found boolean;
    v_live  boolean;
    ch      change_row[] := '{}';
BEGIN
    SELECT * INTO r FROM kv WHERE kind = p_kind AND scope_id = p_sid AND key = p_key FOR UPDATE;
    v_found := FOUND;
    v_live := v_found AND (r.expires_at IS NULL OR r.expires_at > clock_timestamp());
    IF v_found AND NOT v_live AND r.expires_at > '-infinity' THEN
        ch := ch || kv_remove(r, 'expire');
    END IF;
    IF p_if_version IS NOT NULL AND p_if_version <> (CASE WHEN v_live THEN r.version ELSE 0 END) THEN
        PERFORM agentstate_error('VersionConflict',
            format('delete %s:%s %s: expected version %s, the current version is %s',
                   p_kind, p_sid, p_key, p_if_version, CASE WHEN v_live THEN r.version ELSE 0 END),
            (CASE WHEN v_live THEN r.version ELSE 0 END)::text);
    END IF;
    IF v_live THEN
        ch := ch || kv_remove(r, 'delete');
    END IF;
    PERFORM feed_add(ch);
    RETURN v_live;
END $$;

-- Set a live key's expiry p_ttl seconds from now (NULL: never), value and
-- version unchanged; its version, or NULL when absent. (clock_timestamp(), as
-- every write's time: read for the row once it is locked.)
CREATE FUNCTION kv_touch(p_kind text, p_sid text, p_key text, p_ttl double precision)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    r    kv;
    v_id bigint;
BEGIN
    SELECT * INTO r FROM kv WHERE kind = p_kind AND scope_id = p_sid AND key = p_key
      AND (expires_at IS NULL OR expires_at > clock_timestamp()) FOR UPDATE;
    IF NOT FOUND OR NOT (r.expires_at IS NULL OR r.expires_at > clock_timestamp()) THEN
        RETURN NULL;  -- absent (or expired while this waited for its lock)
    END IF;
    UPDATE kv SET expires_at = clock_timestamp() + p_ttl * interval '1 second'  -- NULL when p_ttl is
    WHERE kind = p_kind AND scope_id = p_sid AND key = p_key;
    v_id := history_id();
    PERFORM kv_keep(v_id, r);  -- its expiry as it was
    PERFORM feed_add(ARRAY[ROW('kv', 'touch', p_kind, p_sid, p_key, r.version, NULL, NULL, v_id)::change_row]);
    RETURN r.version;
END $$;

-- Add items at the end of a list (created if absent), under the key's row
-- lock; (length, version) after. p_items_size: bytes of the JSON of
-- [items]. p_ttl: seconds from now, or NULL to keep the key's expiry.
CREATE FUNCTION kv_append(p_kind text, p_sid text, p_key text, p_items text[], p_items_size bigint,
                          p_ttl double precision, OUT o_length bigint, OUT o_version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_n       bigint := cardinality(p_items);
    v_now     timestamptz;
    v_expires timestamptz;
    v_found   boolean;
    v_live    boolean;
    v_length  bigint;
    v_size    bigint;
    v_list    bigint;
    v_id      bigint;
    r         kv;
    ch        change_row[] := '{}';
BEGIN
    LOOP  -- again when another writer created the key meanwhile
        SELECT * INTO r FROM kv WHERE kind = p_kind AND scope_id = p_sid AND key = p_key FOR UPDATE;
        v_found := FOUND;
        v_now := clock_timestamp();  -- the write's own time (as kv_put's)
        v_expires := v_now + p_ttl * interval '1 second';  -- NULL when p_ttl is NULL
        v_live := v_found AND (r.expires_at IS NULL OR r.expires_at > v_now);
        IF v_found AND NOT v_live AND r.expires_at > '-infinity' THEN
            ch := ch || kv_remove(r, 'expire');
            r.version := r.version + 1;
        END IF;
        IF NOT v_live THEN
            v_length := 0;
            v_size := 2;
        ELSE
            IF r.type <> 'list' THEN
                PERFORM agentstate_error('NotAList',
                    format('%s:%s %s holds a %s value, not a list', p_kind, p_sid, p_key, r.type));
            END IF;
            v_length := r.length;
            v_size := r.size;
            IF v_n = 0 THEN  -- nothing to add: only a new expiry, if one was asked for
                IF p_ttl IS NOT NULL THEN
                    UPDATE kv SET expires_at = v_expires
                    WHERE kind = p_kind AND scope_id = p_sid AND key = p_key;
                    v_id := history_id();
                    PERFORM kv_keep(v_id, r);
                    ch := ch || ROW('kv', 'touch', p_kind, p_sid, p_key, r.version, NULL, NULL, v_id)::change_row;
                END IF;
                PERFORM feed_add(ch);
                o_length := v_length;
                o_version := r.version;
                RETURN;
            END IF;
        END IF;
        -- p_items_size is the JSON of [items]: joining two lists drops one pair
        -- of brackets and adds a comma when both are non-empty.
        v_size := v_size + p_items_size - 2 + CASE WHEN v_length > 0 AND v_n > 0 THEN 1 ELSE 0 END;
        IF v_size > 1048576 THEN
            PERFORM agentstate_error('TooLarge',
                format('the list would be %s bytes, over the limit of 1048576', v_size), v_size::text);
        END IF;
        v_id := history_id();
        IF NOT v_found THEN
            v_list := nextval('list_seq');
            INSERT INTO kv (kind, scope_id, key, version, type, list_id, length, size, updated_at, expires_at)
            VALUES (p_kind, p_sid, p_key, 1, 'list', v_list, v_n, v_size, v_now, v_expires)
            ON CONFLICT (kind, scope_id, key) DO NOTHING
            RETURNING version INTO o_version;
            CONTINUE WHEN o_version IS NULL;  -- another writer's row: lock it, and look again
        ELSIF NOT v_live THEN  -- a tombstone: a new list, above its version
            v_list := nextval('list_seq');
            o_version := r.version + 1;
            UPDATE kv SET version = o_version, type = 'list', value = NULL, data = NULL, list_id = v_list,
                          length = v_n, size = v_size, updated_at = v_now, expires_at = v_expires
            WHERE kind = p_kind AND scope_id = p_sid AND key = p_key;
        ELSE
            v_list := r.list_id;
            o_version := r.version + 1;
            UPDATE kv SET version = o_version, length = v_length + v_n, size = v_size,
                          updated_at = v_now,
                          expires_at = CASE WHEN p_ttl IS NULL THEN expires_at ELSE v_expires END
            WHERE kind = p_kind AND scope_id = p_sid AND key = p_key;
            PERFORM kv_keep(v_id, r);  -- the list as it was: its list and length
        END IF;
        INSERT INTO list_item (list_id, idx, item)
        SELECT v_list, v_length + u.ord - 1, u.item::json FROM unnest(p_items) WITH ORDINALITY AS u(item, ord);
        ch := ch || ROW('kv', 'append', p_kind, p_sid, p_key, o_version, v_length, v_n, v_id)::change_row;
        PERFORM feed_add(ch);
        o_length := v_length + v_n;
        RETURN;
    END LOOP;
END $$;

-- Remove the last p_n items of a list: their texts in list order, and the version.
-- Lists made from this one get the items they read first; while history is on, the
-- items move to list_gone, where a past state of the list still reads them.
CREATE FUNCTION kv_pop(p_kind text, p_sid text, p_key text, p_n bigint,
                       OUT o_items text[], OUT o_version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r      kv;
    v_k    bigint;
    v_left bigint;
    v_size bigint;
    v_id   bigint;
    ch     change_row[] := '{}';
BEGIN
    o_items := '{}';
    SELECT * INTO r FROM kv WHERE kind = p_kind AND scope_id = p_sid AND key = p_key FOR UPDATE;
    IF r.expires_at <= clock_timestamp() THEN  -- a tombstone, or expired (made one now)
        IF r.expires_at > '-infinity' THEN
            ch := ch || kv_remove(r, 'expire');
        END IF;
        r := NULL;
    END IF;
    IF r.version IS NULL THEN
        PERFORM feed_add(ch);
        o_version := 0;
        RETURN;
    END IF;
    IF r.type <> 'list' THEN
        PERFORM agentstate_error('NotAList',
            format('%s:%s %s holds a %s value, not a list', p_kind, p_sid, p_key, r.type));
    END IF;
    v_k := least(p_n, r.length);
    IF v_k = 0 THEN
        o_version := r.version;
        RETURN;
    END IF;
    v_left := r.length - v_k;
    IF r.list_id > 0 THEN  -- its own items, all of them (a plan kept by the function)
        SELECT coalesce(array_agg(item::text ORDER BY idx), '{}') INTO o_items FROM list_item
        WHERE list_id = r.list_id AND idx >= v_left AND idx < r.length;
    ELSE  -- made from another list: read through its base
        o_items := list_read(r.list_id, v_left, r.length);
    END IF;
    IF cardinality(o_items) <> v_k THEN
        PERFORM agentstate_error('Damaged', format('list %s: items %s..%s are missing', r.list_id, v_left,
                                                   r.length - 1));
    END IF;
    INSERT INTO list_item (list_id, idx, item)  -- into each list made from this one that reads them
    SELECT b.list_id, v_left + u.o - 1, u.item::json
    FROM list_base b CROSS JOIN unnest(o_items) WITH ORDINALITY AS u(item, o)
    WHERE b.base_id = r.list_id AND b.base_len > v_left + u.o - 1
      -- not past a live list's end: an append there writes its own item
      AND v_left + u.o - 1 < coalesce((SELECT k.length FROM kv k WHERE k.list_id = b.list_id), b.base_len)
    ON CONFLICT (list_id, idx) DO NOTHING;  -- its own item
    DELETE FROM list_item WHERE list_id = r.list_id AND idx >= v_left;
    v_id := history_id();
    IF v_id IS NOT NULL THEN
        INSERT INTO list_gone (list_id, idx, change_id, item)
        SELECT r.list_id, v_left + u.o - 1, v_id, u.item::json FROM unnest(o_items) WITH ORDINALITY AS u(item, o);
        PERFORM kv_keep(v_id, r);
    END IF;
    SELECT sum(octet_length(u)) INTO v_size FROM unnest(o_items) AS u;
    -- The JSON of the list loses the items' bytes and one comma each.
    v_size := CASE WHEN v_left = 0 THEN 2 ELSE r.size - v_size - v_k END;
    o_version := r.version + 1;
    UPDATE kv SET version = o_version, length = v_left, size = v_size, updated_at = clock_timestamp()
    WHERE kind = p_kind AND scope_id = p_sid AND key = p_key;
    ch := ch || ROW('kv', 'pop', p_kind, p_sid, p_key, o_version, v_left, v_k, v_id)::change_row;
    PERFORM feed_add(ch);
END $$;

-- Delete every key of a scope (tombstones, list items deleted): their changes.
CREATE FUNCTION kv_drop_scope(p_kind text, p_sid text) RETURNS change_row[] LANGUAGE plpgsql AS $$
DECLARE
    r  kv;
    ch change_row[] := '{}';
BEGIN
    FOR r IN SELECT * FROM kv WHERE kind = p_kind AND scope_id = p_sid AND expires_at IS DISTINCT FROM '-infinity'
             ORDER BY key FOR UPDATE LOOP
        ch := ch || kv_remove(r, CASE WHEN r.expires_at <= clock_timestamp() THEN 'expire' ELSE 'delete' END);
    END LOOP;
    RETURN ch;
END $$;

-- A fenced write's check (SPEC §14), its first statement: LeaseLost unless the turn runs
-- (or resumes) with its lease held, by the server's clock. The turn's row stays locked
-- (FOR SHARE) until the write commits: starting another turn of the session first
-- expires this one (turn_start's UPDATE), which waits for that lock.
CREATE FUNCTION turn_fence(p_turn text, p_owner text DEFAULT NULL) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_until  timestamptz;
BEGIN
    -- p_owner (the server's caller, unless an admin): another principal's turn is as unknown
    SELECT t.status, t.lease_until INTO v_status, v_until FROM turn t JOIN session s ON s.id = t.session_id
     WHERE t.id = p_turn AND (p_owner IS NULL OR s.owner = p_owner) FOR SHARE OF t;
    IF v_status IS NULL OR v_status NOT IN ('running', 'resuming') OR v_until < clock_timestamp() THEN
        PERFORM agentstate_error('LeaseLost',
            format('turn %L no longer holds its lease (%s): another worker may have taken its '
                   'session over; nothing was written', p_turn,
                   CASE WHEN v_status IS NULL THEN 'unknown'
                        WHEN v_status IN ('queued', 'running', 'resuming') AND v_until < clock_timestamp()
                        THEN 'expired' ELSE v_status END),
            p_turn);
    END IF;
END $$;

-- Delete every key of a scope (scope.clear()): a 'delete' change each; how many were live.
CREATE FUNCTION kv_clear(p_kind text, p_sid text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    ch change_row[] := kv_drop_scope(p_kind, p_sid);
BEGIN
    PERFORM feed_add(ch);
    RETURN (SELECT count(*) FROM unnest(ch) u WHERE u.op = 'delete');
END $$;

-- Pin or unpin a run (prune() leaves a pinned one): a 'pin' change when it changed.
-- Whether the run is pinned now; NULL when there is no such run.
CREATE FUNCTION run_pin(p_id text, p_pinned boolean) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_was boolean;
BEGIN
    SELECT pinned INTO v_was FROM run WHERE id = p_id FOR UPDATE;
    IF v_was IS NULL THEN
        RETURN NULL;
    END IF;
    IF v_was <> p_pinned THEN
        UPDATE run SET pinned = p_pinned WHERE id = p_id;
        PERFORM feed_add(ARRAY[ROW('run', 'pin', NULL, p_id, NULL, NULL, NULL, NULL, NULL)::change_row]);
    END IF;
    RETURN p_pinned;
END $$;

-- Expire up to p_batch keys whose time has come, soonest first (skipping
-- keys another writer holds: it settles them itself): tombstones; their changes.
CREATE FUNCTION kv_purge_expired(p_batch bigint) RETURNS change_row[] LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();  -- a parameter of the query: kv_expiry bounds the scan
    r     kv;
    ch    change_row[] := '{}';
BEGIN
    FOR r IN SELECT * FROM kv WHERE expires_at <= v_now AND expires_at > '-infinity' ORDER BY expires_at
             LIMIT p_batch FOR UPDATE SKIP LOCKED LOOP
        ch := ch || kv_remove(r, 'expire');
    END LOOP;
    RETURN ch;
END $$;

-- Add history entries not yet stored and replace the snapshot (NULL keeps
-- it), under the run's row lock. o_end: the next seq. Entries re-sent with a
-- stored seq whose text differs from the stored one are returned in
-- o_differs with nothing written: the caller compares them as JSON values.
CREATE FUNCTION run_write(p_id text, p_seqs bigint[], p_entries text[], p_snapshot json, p_create boolean,
                          OUT o_end bigint, OUT o_differs bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_next  bigint;
    v_first bigint;
    v_count bigint;
    v_want  bigint;
    v_got   bigint;
    v_now   timestamptz := clock_timestamp();
BEGIN
    SELECT next_seq, first_seq INTO v_next, v_first FROM run WHERE id = p_id FOR UPDATE;
    IF p_create THEN
        IF FOUND THEN
            PERFORM agentstate_error('RunExists', format('run %L exists already', p_id));
        END IF;
        v_next := 0;
        v_first := 0;
    ELSIF NOT FOUND THEN
        PERFORM agentstate_error('RunNotFound', format('no run %L (create=True makes a new one)', p_id));
    ELSE  -- re-sent entries below first_seq were trimmed away: nothing to compare them with
        SELECT array_agg(u.seq ORDER BY u.seq) INTO o_differs
        FROM unnest(p_seqs, p_entries) AS u(seq, entry)
        LEFT JOIN run_entry e ON e.run_id = p_id AND e.seq = u.seq
        WHERE u.seq >= v_first AND u.seq < v_next AND e.entry::text IS DISTINCT FROM u.entry;
        IF o_differs IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    SELECT n.seq, v_next + n.rn - 1 INTO v_got, v_want
    FROM (SELECT u.seq, row_number() OVER (ORDER BY u.ord) AS rn
          FROM unnest(p_seqs) WITH ORDINALITY AS u(seq, ord) WHERE u.seq >= v_next) n
    WHERE n.seq <> v_next + n.rn - 1 ORDER BY n.rn LIMIT 1;
    IF FOUND THEN
        PERFORM agentstate_error('HistoryGap',
            format('run %L: expected seq %s next (stored up to %s), got %s', p_id, v_want, v_next - 1, v_got));
    END IF;
    SELECT count(*) INTO v_count FROM unnest(p_seqs) AS s WHERE s >= v_next;
    o_end := v_next + v_count;
    IF p_create THEN
        INSERT INTO run (id, snapshot, next_seq, created_at, updated_at)
        VALUES (p_id, p_snapshot, o_end, v_now, v_now)
        ON CONFLICT (id) DO NOTHING;
        IF NOT FOUND THEN  -- another writer created it meanwhile
            PERFORM agentstate_error('RunExists', format('run %L exists already', p_id));
        END IF;
    ELSE
        UPDATE run SET snapshot = coalesce(p_snapshot, snapshot), next_seq = o_end, updated_at = v_now
        WHERE id = p_id;
    END IF;
    IF v_count > 0 THEN
        INSERT INTO run_entry (run_id, seq, entry)
        SELECT p_id, u.seq, u.entry::json FROM unnest(p_seqs, p_entries) AS u(seq, entry)
        WHERE u.seq >= v_next;
    END IF;
    PERFORM feed_add(ARRAY[ROW('run', CASE WHEN p_create THEN 'create' ELSE 'write' END, NULL, p_id, NULL,
                               NULL, v_next, v_count, NULL)::change_row]);
END $$;

CREATE FUNCTION run_delete(p_id text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run WHERE id = p_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM feed_add(ARRAY[ROW('run', 'delete', NULL, p_id, NULL, NULL, NULL, NULL, NULL)::change_row]);
    RETURN true;
END $$;

-- Remove the entries with seq < p_before; the history then starts at that seq.
CREATE FUNCTION run_trim(p_id text, p_before bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_next    bigint;
    v_first   bigint;
    v_new     bigint;
BEGIN
    SELECT next_seq, first_seq INTO v_next, v_first FROM run WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM agentstate_error('RunNotFound', format('no run %L', p_id));
    END IF;
    v_new := least(greatest(p_before, v_first), v_next);  -- never past the last entry: no gap
    IF v_new = v_first THEN
        RETURN 0;
    END IF;
    UPDATE run SET first_seq = v_new WHERE id = p_id;
    -- what the trim removes of each call (a string call id: what once() looks up): its newest entry
    INSERT INTO run_call (run_id, call_id, seq, entry)
    SELECT DISTINCT ON (entry ->> 'call_id') p_id, entry ->> 'call_id', seq, entry
    FROM run_entry
    WHERE run_id = p_id AND seq < v_new AND (entry ->> 'type') IN ('tool_call', 'tool_result')
      AND json_typeof(entry -> 'call_id') = 'string'
    ORDER BY entry ->> 'call_id', seq DESC
    ON CONFLICT (run_id, call_id) DO UPDATE SET seq = excluded.seq, entry = excluded.entry
    WHERE excluded.seq > run_call.seq;
    DELETE FROM run_entry WHERE run_id = p_id AND seq < v_new;
    PERFORM feed_add(ARRAY[ROW('run', 'trim', NULL, p_id, NULL, NULL, v_new, v_new - v_first, NULL)::change_row]);
    RETURN v_new - v_first;
END $$;

-- Delete the runs last written before p_cutoff (only finished ones if asked), never a
-- pinned one; their ids.
CREATE FUNCTION run_prune(p_cutoff timestamptz, p_finished_only boolean) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_ids text[];
BEGIN
    WITH gone AS (
        DELETE FROM run WHERE id IN (
            SELECT id FROM run WHERE updated_at < p_cutoff AND NOT pinned
               AND (NOT p_finished_only
                    OR (json_typeof(snapshot -> 'finished') = 'boolean' AND (snapshot ->> 'finished') = 'true'))
            FOR UPDATE)
        RETURNING id, updated_at)
    SELECT coalesce(array_agg(id ORDER BY updated_at, id), '{}') INTO v_ids FROM gone;
    PERFORM feed_add(ARRAY(SELECT ROW('run', 'delete', NULL, i, NULL, NULL, NULL, NULL, NULL)::change_row
                           FROM unnest(v_ids) WITH ORDINALITY AS u(i, ord) ORDER BY ord));
    RETURN v_ids;
END $$;

-- A new run with the entries up to and including p_upto (NULL: all) and the snapshot.
CREATE FUNCTION run_fork(p_src text, p_new text, p_upto bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_snapshot json;
    v_first    bigint;
    v_next     bigint;
    v_end      bigint;
    v_now      timestamptz := clock_timestamp();
BEGIN
    SELECT snapshot, first_seq, next_seq INTO v_snapshot, v_first, v_next FROM run WHERE id = p_src FOR SHARE;
    IF NOT FOUND THEN
        PERFORM agentstate_error('RunNotFound', format('no run %L to fork', p_src));
    END IF;
    IF EXISTS (SELECT 1 FROM run WHERE id = p_new) THEN
        PERFORM agentstate_error('RunExists', format('run %L exists already', p_new));
    END IF;
    IF p_upto IS NOT NULL AND p_upto < v_first THEN
        PERFORM agentstate_error('HistoryGap',
            format('run %L was trimmed: its history starts at seq %s, after upto=%s', p_src, v_first, p_upto));
    END IF;
    v_end := CASE WHEN p_upto IS NULL THEN v_next ELSE least(p_upto, v_next - 1) + 1 END;  -- no overflow
    INSERT INTO run (id, snapshot, next_seq, first_seq, created_at, updated_at)
    VALUES (p_new, v_snapshot, v_end, v_first, v_now, v_now)
    ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        PERFORM agentstate_error('RunExists', format('run %L exists already', p_new));
    END IF;
    INSERT INTO run_entry (run_id, seq, entry)
    SELECT p_new, seq, entry FROM run_entry WHERE run_id = p_src AND seq < v_end ORDER BY seq;
    -- the calls a trim took out of the source's history are the fork's too (all below first)
    INSERT INTO run_call (run_id, call_id, seq, entry)
    SELECT p_new, call_id, seq, entry FROM run_call WHERE run_id = p_src;
    PERFORM feed_add(ARRAY[ROW('run', 'fork', NULL, p_new, NULL, NULL, v_first, v_end - v_first, NULL)::change_row]);
END $$;

CREATE FUNCTION session_create(p_id text, p_owner text, p_metadata json) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO session (id, owner, created_at, metadata) VALUES (p_id, p_owner, v_now, p_metadata);
    PERFORM feed_add(ARRAY[ROW('session', 'create', NULL, p_id, NULL, NULL, NULL, NULL, NULL)::change_row]);
    RETURN iso_utc(v_now);
END $$;

-- The session, its turns (cascade) and its session-scope keys, remembering versions.
CREATE FUNCTION session_delete(p_id text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ch change_row[];
BEGIN
    ch := kv_drop_scope('session', p_id);
    DELETE FROM session WHERE id = p_id;
    IF FOUND THEN
        ch := ch || ROW('session', 'delete', NULL, p_id, NULL, NULL, NULL, NULL, NULL)::change_row;
    END IF;
    PERFORM feed_add(ch);
END $$;

-- Insert a queued or running turn after expiring lapsed leases; SessionBusy
-- (with the active turn's id) while another turn is queued or running.
-- The session's row lock makes concurrent starts of one session take turns.
CREATE FUNCTION turn_start(p_id text, p_session text, p_status text, p_input json, p_lease double precision)
RETURNS turn LANGUAGE plpgsql AS $$
DECLARE
    t      turn;
    v_now  timestamptz := clock_timestamp();
    v_busy text;
    ch     change_row[];
BEGIN
    PERFORM 1 FROM session WHERE id = p_session FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM agentstate_error('NotFound', format('no session %L', p_session));
    END IF;
    WITH lapsed AS (
        UPDATE turn SET status = 'expired', updated_at = v_now
        WHERE session_id = p_session AND status IN ('queued', 'running', 'resuming') AND lease_until < v_now
        RETURNING id, n)
    SELECT coalesce(array_agg(ROW('session', 'expired', NULL, p_session, id, NULL, NULL, NULL, NULL)::change_row
                              ORDER BY n), '{}')
    INTO ch FROM lapsed;
    INSERT INTO turn (id, session_id, n, status, input, lease, lease_until, created_at, updated_at)
    VALUES (p_id, p_session, 1 + coalesce((SELECT max(n) FROM turn WHERE session_id = p_session), 0),
            p_status, p_input, p_lease, v_now + p_lease * interval '1 second', v_now, v_now)
    ON CONFLICT (session_id) WHERE status IN ('queued', 'running') DO NOTHING
    RETURNING * INTO t;
    IF t.id IS NULL THEN
        SELECT id INTO v_busy FROM turn WHERE session_id = p_session AND status IN ('queued', 'running');
        PERFORM agentstate_error('SessionBusy',
            format('session %L has an active turn %L', p_session, v_busy), v_busy);
    END IF;
    PERFORM feed_add(ch || ROW('session', p_status, NULL, p_session, p_id, NULL, NULL, NULL, NULL)::change_row);
    RETURN t;
END $$;

-- Change a turn's state if it is in p_from (and its lease holds); p_sets
-- names the columns of request, decision, result, error to set.
CREATE FUNCTION turn_move(p_id text, p_from text[], p_to text, p_lease double precision, p_what text,
                          p_sets text[], p_request json, p_decision json, p_result json, p_error text)
RETURNS turn LANGUAGE plpgsql AS $$
DECLARE
    t     turn;
    v_now timestamptz := clock_timestamp();
BEGIN
    UPDATE turn SET status = p_to, updated_at = v_now,
                    lease_until = v_now + p_lease * interval '1 second',
                    lease = coalesce(p_lease, lease),
                    request = CASE WHEN 'request' = ANY (p_sets) THEN p_request ELSE request END,
                    decision = CASE WHEN 'decision' = ANY (p_sets) THEN p_decision ELSE decision END,
                    result = CASE WHEN 'result' = ANY (p_sets) THEN p_result ELSE result END,
                    error = CASE WHEN 'error' = ANY (p_sets) THEN p_error ELSE error END
    WHERE id = p_id AND status = ANY (p_from)
      AND NOT (status IN ('queued', 'running', 'resuming') AND lease_until < v_now)
    RETURNING * INTO t;
    IF t.id IS NOT NULL THEN
        PERFORM feed_add(ARRAY[ROW('session', p_to, NULL, t.session_id, p_id, NULL, NULL, NULL, NULL)::change_row]);
        RETURN t;
    END IF;
    SELECT * INTO t FROM turn WHERE id = p_id;
    IF t.id IS NULL THEN
        PERFORM agentstate_error('NotFound', format('no turn %L', p_id));
    END IF;
    PERFORM agentstate_error('InvalidTransition', format('cannot %s turn %L: it is %s', p_what, p_id,
        CASE WHEN t.status IN ('queued', 'running', 'resuming') AND t.lease_until < v_now THEN 'expired'
             ELSE t.status END));
END $$;

-- The history's part of a purge step: the floor moves past the changes older than
-- history_retention (and never stays below the feed's bound, p_bound: the first seq the
-- feed keeps), and what the changes up to it kept goes, up to p_batch changes' worth, in
-- seq order; then up to p_batch items of lists nothing reads any more. Under
-- history_head's row lock (a purge that finds it taken skips this part, and the feed's
-- rows with it). (seq of the last change whose before-image went, rows gone.)
CREATE FUNCTION history_purge(p_batch bigint, p_bound bigint, OUT o_done bigint, OUT o_rows bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_keep  bigint := coalesce((SELECT value FROM setting WHERE name = 'history_retention'), 86400);
    v_floor bigint;
    v_span  bigint;
    v_list  bigint;
    v_n     bigint;
BEGIN
    o_rows := 0;
    SELECT floor, done INTO v_floor, o_done FROM history_head FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        o_done := NULL;  -- another purge holds it
        RETURN;
    END IF;
    SELECT greatest(v_floor, p_bound - 1,
                    coalesce(min(seq) FILTER (WHERE at >= clock_timestamp() - v_keep * interval '1 second') - 1,
                             max(seq)))
    INTO v_floor FROM (SELECT seq, at FROM change WHERE seq > v_floor ORDER BY seq LIMIT p_batch) first_rows;
    WITH span AS (SELECT seq, id FROM change WHERE seq > o_done AND seq <= v_floor ORDER BY seq LIMIT p_batch),
         kept AS (DELETE FROM kv_history WHERE change_id IN (SELECT id FROM span) RETURNING list_id),
         gone AS (DELETE FROM list_gone WHERE change_id IN (SELECT id FROM span) RETURNING 1),
         dead AS (INSERT INTO list_dead SELECT DISTINCT list_id FROM kept WHERE list_id IS NOT NULL
                  ON CONFLICT DO NOTHING)
    SELECT CASE WHEN count(*) < p_batch THEN v_floor ELSE max(seq) END,
           (SELECT count(*) FROM kept) + (SELECT count(*) FROM gone)
    INTO o_done, o_rows FROM span;
    UPDATE history_head SET floor = v_floor, done = o_done;
    FOR v_list IN SELECT list_id FROM list_dead ORDER BY list_id LIMIT p_batch LOOP
        EXIT WHEN o_rows >= p_batch;
        -- list_based's lock: a list made from this one now is not left without its base
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended('agentstate:list:' || current_schema(),
                                                                     v_list));
        IF EXISTS (SELECT FROM kv WHERE list_id = v_list) OR EXISTS (SELECT FROM kv_history WHERE list_id = v_list)
           OR EXISTS (SELECT FROM list_base WHERE base_id = v_list) THEN
            DELETE FROM list_dead WHERE list_id = v_list;  -- read again: not dead
            CONTINUE;
        END IF;
        DELETE FROM list_item WHERE list_id = v_list AND idx IN (
            SELECT idx FROM list_item WHERE list_id = v_list ORDER BY idx DESC LIMIT p_batch - o_rows);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        o_rows := o_rows + v_n;
        IF NOT EXISTS (SELECT FROM list_item WHERE list_id = v_list) THEN
            PERFORM list_drop(v_list);  -- its popped items, its base row (the base then queued)
            DELETE FROM list_dead WHERE list_id = v_list;
        END IF;
    END LOOP;
END $$;

-- The bounded purge: up to p_batch feed rows past the retention, what history keeps
-- past its own (history_purge), and up to p_batch expired keys; the expired keys'
-- changes, and how many rows went. Feed rows go from the oldest seq on, up to the
-- first one still within the retention: seqs follow commit order, not `at` (a commit
-- that waited gets a higher seq with an older `at`), so the feed kept is always every
-- seq from its first one on, and a reader's "oldest kept" check (feed.scan) holds; and
-- never past what the history's purge has done (it finds a change's before-image
-- through the change's row). (604800: the default feed_retention, as in
-- agentstate/_feed.py.)
CREATE FUNCTION feed_purge_step(p_batch bigint, OUT o_changes change_row[], OUT o_rows bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_retention bigint := coalesce((SELECT value FROM setting WHERE name = 'feed_retention'), 604800);
    v_cutoff    timestamptz := clock_timestamp() - v_retention * interval '1 second';
    v_bound     bigint;
    v_n         bigint;
    h           record;
BEGIN
    SELECT coalesce(min(seq) FILTER (WHERE at >= v_cutoff), max(seq) + 1)
    INTO v_bound FROM (SELECT seq, at FROM change ORDER BY seq LIMIT p_batch) first_rows;
    SELECT * INTO h FROM history_purge(p_batch, v_bound);
    o_rows := h.o_rows;
    IF h.o_done IS NOT NULL THEN  -- (else another purge holds the history's row: its turn)
        DELETE FROM change WHERE seq IN (  -- rows another purge holds are its to delete
            SELECT seq FROM change WHERE seq < least(v_bound, h.o_done + 1) FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        o_rows := o_rows + v_n;
    END IF;
    o_changes := kv_purge_expired(p_batch);
    o_rows := o_rows + cardinality(o_changes);
END $$;

-- One purge step by hand (psql: SELECT feed_purge(1000)); how many rows went.
CREATE FUNCTION feed_purge(p_batch bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    step record;
BEGIN
    SELECT * INTO step FROM feed_purge_step(p_batch);
    PERFORM feed_add(step.o_changes);  -- numbered by the next reader, as a write's
    RETURN step.o_rows;
END $$;

-- Views for people using psql (the same as schema.sql's for the sqlite3 shell).

-- Every live key with its scope, value and version (expired keys left out).
CREATE VIEW state AS
SELECT kind, scope_id, key,
       CASE type WHEN 'list' THEN ('[' || array_to_string(list_read(list_id, 0, length), ',') || ']')::json
                 WHEN 'bytes' THEN to_json(bytes_text(data))
                 ELSE value END AS value,
       type, version, length, size, iso_utc(updated_at) AS updated_at, iso_utc(expires_at) AS expires_at
FROM kv
WHERE expires_at IS NULL OR expires_at > now();

-- Every history entry of every run, in order.
CREATE VIEW run_history AS
SELECT run_id, seq, entry ->> 'type' AS type, entry
FROM run_entry;

-- Runs with their snapshot's summary fields.
CREATE VIEW runs AS
SELECT id, snapshot ->> 'task' AS task, snapshot -> 'turn' AS turn, snapshot -> 'finished' AS finished,
       next_seq - first_seq AS entries, first_seq, pinned, iso_utc(created_at) AS created_at,
       iso_utc(updated_at) AS updated_at
FROM run;

-- Turns that block or may still act: queued, running, held, decided, resuming.
CREATE VIEW active_turns AS
SELECT t.session_id, s.owner, t.id AS turn_id, t.n, t.status, iso_utc(t.lease_until) AS lease_until,
       t.lease_until < now() AS lease_lapsed, iso_utc(t.updated_at) AS updated_at
FROM turn t JOIN session s ON s.id = t.session_id
WHERE t.status IN ('queued', 'running', 'held', 'decided', 'resuming');

-- The change feed, as SPEC §9 names its columns. Committed changes no reader
-- has numbered yet (change_new) are shown with the seqs they will get if no
-- change with an earlier ticket commits meanwhile; `SELECT feed_sequence()`
-- numbers them for good (every read of the feed by a client does).
CREATE VIEW changes AS
SELECT seq, iso_utc(at) AS at, topic, op, kind, scope_id, key, version, start, count FROM change
UNION ALL
SELECT h.last + row_number() OVER (ORDER BY n.ticket, n.ord), iso_utc(n.at), n.topic, n.op, n.kind,
       n.scope_id, n.key, n.version, n.start, n.count
FROM change_new n CROSS JOIN feed_head h;

INSERT INTO agentstate_version (version) VALUES (7);
